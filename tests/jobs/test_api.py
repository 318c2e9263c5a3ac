"""The jobs API and pages: submit, progress with a job token, faults with Idempotency-Key, stats, scoping."""

import pytest
from django.urls import reverse

from jobs.models import FaultEvent, Job, RecoveryAction
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tenant_a, tenant_b):
    shared = protected_cluster(nodes=6, spares=2, connection=INSTANT)
    job_a = submit(shared, tenant_a, gpus=16, name="acme-llm")
    job_b = submit(shared, tenant_b, gpus=8, name="globex-llm")
    return shared, job_a, job_b


def test_tenant_admin_submits_on_a_simulated_cluster_and_gets_a_job_token(api, users, tenant_a, world):
    shared, _, _ = world
    response = api.as_token(users["tenant-admin"]).post(
        "/api/v1/jobs/", {"name": "x", "cluster": shared.pk, "gpus": 16}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (
        body["token"].startswith("lsj_") and body["tenant"] == tenant_a.pk and len(body["allocations"]) == 2
    )
    assert body["allocations"][1]["rank_start"] == 8 and body["protected"] is True
    viewer = api.as_token(users["tenant-viewer"]).post(
        "/api/v1/jobs/", {"name": "y", "cluster": shared.pk, "gpus": 8}, format="json"
    )
    assert viewer.status_code == 403
    provider = api.as_token(users["operator"]).post(
        "/api/v1/jobs/", {"name": "z", "cluster": shared.pk, "gpus": 8}, format="json"
    )
    assert provider.status_code == 400 and "tenant" in provider.json()
    too_big = api.as_token(users["tenant-admin"]).post(
        "/api/v1/jobs/", {"name": "w", "cluster": shared.pk, "gpus": 800}, format="json"
    )
    assert too_big.status_code == 409
    assert "needs 100 nodes for its GPUs" in too_big.json()["gpus"][0], too_big.json()


def test_progress_with_the_job_token_only_for_its_own_job(api, users, world):
    _, job_a, job_b = world
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job_a.token}")
    response = api.post(
        f"/api/v1/jobs/{job_a.pk}/progress/",
        {"iteration": 500, "step_seconds": 2.0, "checkpoint": True},
        format="json",
    )
    assert response.status_code == 200, response.content
    job_a.refresh_from_db()
    assert (
        job_a.iteration == 500
        and job_a.last_checkpoint_iteration == 500
        and job_a.simulated
        and job_a.reports_progress
    )
    assert api.post(f"/api/v1/jobs/{job_b.pk}/progress/", {"iteration": 1}, format="json").status_code == 403
    assert api.get("/api/v1/jobs/").status_code in (401, 403)  # a job token reads nothing
    api.credentials(HTTP_AUTHORIZATION="Bearer lsj_zzzzzzzz_" + "x" * 43)
    assert api.post(f"/api/v1/jobs/{job_a.pk}/progress/", {"iteration": 1}, format="json").status_code == 401
    api.credentials()
    bad = api.as_token(users["tenant-admin"]).post(
        f"/api/v1/jobs/{job_a.pk}/progress/", {"iteration": -1}, format="json"
    )
    assert bad.status_code == 400


def test_reporting_a_fault_is_for_provider_roles_and_idempotent(api, users, world):
    _, job_a, _ = world
    node = node_of(job_a)
    payload = {"node": node.pk, "kind": "gpu_xid", "xid": 79, "gpu_index": 2}
    assert (
        api.as_token(users["tenant-admin"]).post("/api/v1/faults/", payload, format="json").status_code == 403
    )
    api.credentials()
    first = api.as_token(users["operator"]).post(
        "/api/v1/faults/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    again = api.post("/api/v1/faults/", payload, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201 and again.status_code == 200 and first.json()["id"] == again.json()["id"]
    assert FaultEvent.objects.count() == 1
    assert api.post("/api/v1/faults/", {"node": node.pk, "kind": "gpu_xid"}, format="json").status_code == 400
    assert api.post("/api/v1/faults/", {"node": 10**9, "kind": "thermal"}, format="json").status_code == 400
    assert api.post("/api/v1/faults/", {"node": node.pk, "kind": "bogus"}, format="json").status_code == 400


def test_tenants_see_only_their_own_jobs_faults_actions_and_figures(api, users, client, world):
    _, job_a, job_b = world
    reported = {}
    for job in (job_a, job_b):
        fault = (
            api.as_token(users["operator"])
            .post("/api/v1/faults/", {"node": node_of(job).pk, "kind": "node_unreachable"}, format="json")
            .json()
        )
        fault_handle(fault_id=fault["id"])
        reported[job.pk] = fault
    recovery_advance()
    api.credentials()
    mine = api.as_token(users["tenant-viewer"])
    assert [j["id"] for j in mine.get("/api/v1/jobs/").json()["results"]] == [job_a.pk]
    assert mine.get(f"/api/v1/jobs/{job_b.pk}/").status_code == 404
    assert mine.get(f"/api/v1/jobs/{job_b.pk}/timeline/").status_code == 404
    assert {a["job"] for a in mine.get("/api/v1/actions/").json()["results"]} == {job_a.pk}
    faults = mine.get("/api/v1/faults/").json()["results"]
    assert [f["id"] for f in faults] == [reported[job_a.pk]["id"]]
    assert mine.get(f"/api/v1/events/?topic=job-{job_b.pk}").status_code == 403
    stats = mine.get("/api/v1/stats/").json()
    assert [g["id"] for g in stats["groups"]] == [job_a.tenant_id] and stats["totals"]["actions"] == 1
    assert mine.get("/api/v1/stats/?group=fleet").status_code == 403
    assert mine.post(f"/api/v1/jobs/{job_a.pk}/cancel/").status_code == 403
    # Pages too.
    client.force_login(users["tenant-viewer"])
    assert client.get(reverse("job-detail", args=[job_b.pk])).status_code == 404
    listing = client.get(reverse("job-list")).content.decode()
    assert "acme-llm" in listing and "globex-llm" not in listing
    page = client.get(reverse("job-detail", args=[job_a.pk])).content.decode()
    assert (
        "timeline-data" in page and "vendor/plotly.min.js" in page and f'data-topic="job-{job_a.pk}"' in page
    )
    overview = client.get(reverse("fault-overview")).content.decode()
    assert f"tenant-{job_a.tenant_id}" in overview and reported[job_b.pk]["hostname"] not in overview
    assert reported[job_a.pk]["hostname"] in overview


def test_timeline_stats_snapshots_and_cancel(api, users, world):
    _, job_a, _ = world
    api.as_token(users["provider-admin"])
    fault = api.post(
        "/api/v1/faults/", {"node": node_of(job_a).pk, "kind": "node_unreachable"}, format="json"
    ).json()
    fault_handle(fault_id=fault["id"])
    recovery_advance()
    timeline = api.get(f"/api/v1/jobs/{job_a.pk}/timeline/").json()
    assert [p["kind"] for p in timeline["phases"]] == ["running", "recovering", "running"]
    assert timeline["faults"][0]["fault"] == fault["id"] and timeline["actions"][0]["state"] == "succeeded"
    assert timeline["gpu_hours_saved"] == pytest.approx(
        RecoveryAction.objects.get(job=job_a).gpu_hours_saved, abs=1e-3
    )
    assert len(timeline["iterations"]["t"]) == len(timeline["iterations"]["counterfactual"])
    for group in ("job", "cluster", "tenant", "fleet"):
        stats = api.get(f"/api/v1/stats/?group={group}&bucket=minute").json()
        assert stats["totals"]["actions"] == 1 and stats["series"][0]["cumulative"] > 0
    assert api.get("/api/v1/stats/?group=nope").status_code == 400
    snapshot = api.post(f"/api/v1/jobs/{job_a.pk}/snapshots/")
    assert snapshot.status_code == 201, snapshot.content
    assert api.get(f"/api/v1/jobs/{job_a.pk}/snapshots/").json()[0]["id"] == snapshot.json()["id"]
    assert api.post(f"/api/v1/jobs/{job_a.pk}/cancel/").json()["state"] == "Cancelled"
    assert api.post(f"/api/v1/jobs/{job_a.pk}/cancel/").status_code == 409
    assert Job.objects.get(pk=job_a.pk).allocations.filter(released_at__isnull=True).count() == 0


def test_job_list_query_count_does_not_grow_with_jobs(api, users, world, django_assert_max_num_queries):
    shared, _, _ = world
    api.as_token(users["provider-admin"], "read")
    with django_assert_max_num_queries(14):
        api.get("/api/v1/jobs/")
    for _ in range(3):
        submit(shared, users["tenant-admin"].membership.tenant, gpus=8)
    with django_assert_max_num_queries(14):
        api.get("/api/v1/jobs/")


def test_a_simulator_run_job_that_reports_progress_is_still_simulated(api, users, world):
    """``simulated`` says where the job runs (a simulated cluster), ``reports_progress`` whether its own reports
    drive it: a simulator job reporting through the API is both (it used to read ``simulated: false``)."""
    _, job_a, job_b = world
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job_a.token}")
    assert api.post(f"/api/v1/jobs/{job_a.pk}/progress/", {"iteration": 5}, format="json").status_code == 200
    api.credentials()
    operator = api.as_token(users["operator"])
    rows = {row["id"]: row for row in operator.get("/api/v1/jobs/").json()["results"]}
    assert (rows[job_a.pk]["simulated"], rows[job_a.pk]["reports_progress"]) == (True, True)
    assert (rows[job_b.pk]["simulated"], rows[job_b.pk]["reports_progress"]) == (True, False)
    reporting = operator.get("/api/v1/jobs/", {"reports_progress": "true"}).json()["results"]
    assert [row["id"] for row in reporting] == [job_a.pk]
    assert {row["id"] for row in operator.get("/api/v1/jobs/", {"simulated": "true"}).json()["results"]} >= {
        job_a.pk,
        job_b.pk,
    }
    assert operator.get("/api/v1/jobs/", {"simulated": "false"}).json()["results"] == []
