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


def test_launcher_credentials_are_bound_to_a_tenant(tenant_a, tenant_b):
    from controlplane.models import AuditEntry

    shared = make_cluster(make_fleet(), driver=DriverName.SLURM)
    dedicated = make_cluster(make_fleet(), driver=DriverName.SLURM, dedicated_tenant=tenant_a)
    operator = client_for(make_user("operator"))

    def create(**body):
        return operator.post("/api/v1/launcher-credentials/", {"name": "x", **body}, format="json")

    answer = create(cluster=shared.pk, tenant=tenant_b.pk)
    assert answer.status_code == 201, answer.content
    assert answer.json()["tenant"] == tenant_b.pk
    entry = AuditEntry.objects.get(action="launcher_credential.create", object_id=str(answer.json()["id"]))
    assert entry.tenant_id == tenant_b.pk and entry.changes["tenant"] == tenant_b.slug
    # On a dedicated cluster: its tenant's, by default; another tenant is refused.
    assert create(cluster=dedicated.pk).json()["tenant"] == tenant_a.pk
    assert create(cluster=dedicated.pk, tenant=tenant_a.pk).json()["tenant"] == tenant_a.pk
    for wrong in (tenant_b.pk, 999999, 2**70, "beta", -1):
        answer = create(cluster=dedicated.pk, tenant=wrong)
        assert answer.status_code == 400 and "tenant" in answer.json(), (wrong, answer.content)
    # Cluster-wide on a shared cluster; listed as such.
    answer = create(cluster=shared.pk, tenant=None)
    assert answer.status_code == 201 and answer.json()["tenant"] is None
    listed = {
        row["id"]: row["tenant"] for row in operator.get("/api/v1/launcher-credentials/").json()["results"]
    }
    assert listed[answer.json()["id"]] is None


def test_a_cluster_wide_credential_registers_nothing_where_jobs_do_not_prove_themselves(tenant_a):
    shared = make_cluster(make_fleet(), driver=DriverName.SLURM, connection={"slurm_conf": "/nonexistent"})
    _, everyones = launcher_credential_create(actor=None, cluster=shared, name="x")
    launcher = APIClient()
    launcher.credentials(HTTP_AUTHORIZATION=f"Bearer {everyones}")
    answer = launcher.post("/api/v1/launchers/register/", {"slurm_job_id": "1"}, format="json")
    assert answer.status_code == 403 and "for no tenant" in answer.json()["detail"], answer.content
    # A key too short to be the prolog's is the provider's to fix: said, and nothing registered.
    shared.connection = {**shared.connection, "job_secret_key": "short"}
    shared.save(update_fields=["connection"])
    answer = launcher.post("/api/v1/launchers/register/", {"slurm_job_id": "1"}, format="json")
    assert answer.status_code == 503 and "job_secret_key" in answer.json()["detail"], answer.content
