"""Launcher credentials: who may create them, revoking, and what a credential of a non-Slurm cluster may do
(no Slurm needed)."""

from rest_framework.test import APIClient

from fleet.choices import DriverName
from jobs.launchers import launcher_credential_create
from tests.support.factories import make_cluster, make_fleet, make_user, token_header


def client_for(user) -> APIClient:
    client = APIClient()
    client.credentials(**token_header(user))
    return client


def test_slurm_launcher_credentials_are_provider_only_shown_once_and_revocable(tenant_a):
    cluster = make_cluster(make_fleet(), driver=DriverName.SLURM, dedicated_tenant=tenant_a)
    tenant_admin = client_for(make_user("tenant-admin", tenant_a))
    assert (
        tenant_admin.post(
            "/api/v1/launcher-credentials/", {"cluster": cluster.pk, "name": "x"}, format="json"
        ).status_code
        == 403
    )
    operator = client_for(make_user("operator"))
    assert (
        operator.post(
            "/api/v1/launcher-credentials/", {"cluster": 999999, "name": "x"}, format="json"
        ).status_code
        == 400
    )
    answer = operator.post(
        "/api/v1/launcher-credentials/", {"cluster": cluster.pk, "name": "sbatch"}, format="json"
    )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["token"].startswith("lsl_") and body["cluster"] == cluster.pk
    listed = operator.get("/api/v1/launcher-credentials/").json()
    assert (
        all("token" not in row for row in listed["results"])
        and listed["results"][0]["prefix"] == body["prefix"]
    )
    launcher = APIClient()
    launcher.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    # A user's token may not register, nor the credential list credentials.
    assert (
        operator.post("/api/v1/launchers/register/", {"slurm_job_id": "1"}, format="json").status_code == 401
    )
    assert launcher.get("/api/v1/launcher-credentials/").status_code in (401, 403)
    assert operator.delete(f"/api/v1/launcher-credentials/{body['id']}/").status_code == 204
    assert (
        launcher.post("/api/v1/launchers/register/", {"slurm_job_id": "1"}, format="json").status_code == 401
    )


def test_slurm_launcher_credential_of_a_simulated_cluster_registers_nothing(db):
    cluster = make_cluster(make_fleet())
    _, raw = launcher_credential_create(actor=None, cluster=cluster, name="x")
    launcher = APIClient()
    launcher.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    answer = launcher.post("/api/v1/launchers/register/", {"slurm_job_id": "1"}, format="json")
    assert answer.status_code == 403 and "not a Slurm cluster" in answer.json()["detail"]
    assert launcher.post("/api/v1/launchers/register/", {}, format="json").status_code == 400
    assert (
        launcher.post("/api/v1/launchers/register/", "[1,2]", content_type="application/json").status_code
        == 400
    )
