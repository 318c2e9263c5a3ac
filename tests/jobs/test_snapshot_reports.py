"""What a job's protection runtime reports to POST /api/v1/jobs/{id}/snapshots/ with its job token: restore
points the planner may use, restores and fallbacks and hangs recorded beside them; bad input is a 4xx."""

import pytest

from controlplane.models import AuditEntry, Event
from jobs.choices import JobState
from jobs.models import FaultEvent, JobSnapshot, RecoveryEstimate
from jobs.services.planning import snapshots_of
from jobs.services.snapshots import runtime_restore_point
from tests.support.jobs import INSTANT, protected_cluster, submit

pytestmark = pytest.mark.django_db

POINT = {
    "kind": "snapshot",
    "iteration": 120,
    "seconds": 0.031,
    "bytes": 44_943_936,
    "locations": [
        {"rank": 0, "own": "node0", "replica": "node1"},
        {"rank": 1, "own": "node1", "replica": "node2"},
    ],
}


@pytest.fixture
def world(tenant_a, tenant_b):
    shared = protected_cluster(nodes=6, spares=2, connection=INSTANT)
    return submit(shared, tenant_a, gpus=16, name="acme-llm"), submit(
        shared, tenant_b, gpus=8, name="globex-llm"
    )


def test_the_job_token_reports_restore_points_restores_and_hangs(api, users, world):
    job_a, _ = world
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job_a.token}")
    url = f"/api/v1/jobs/{job_a.pk}/snapshots/"
    point = api.post(url, POINT, format="json")
    assert point.status_code == 201, point.content
    body = point.json()
    assert body["kind"] == "snapshot" and body["state"] == "succeeded" and body["reason"] == "runtime"
    assert body["size_bytes"] == 44_943_936 and body["seconds"] == pytest.approx(0.031, abs=1e-3)
    assert body["locations"][1] == {"rank": 1, "own": "node1", "replica": "node2"}
    restore = api.post(
        url,
        {
            "kind": "restore",
            "iteration": 120,
            "seconds": 0.4,
            "bytes": 44_943_936,
            "locations": [{"rank": 1, "source": "replica on node2"}],
        },
        format="json",
    )
    fallback = api.post(
        url,
        {
            "kind": "disk_fallback",
            "iteration": 100,
            "seconds": 1.5,
            "note": "every copy of rank(s) 1 at iteration 130 is gone",
        },
        format="json",
    )
    hang = api.post(
        url,
        {
            "kind": "hang",
            "iteration": 131,
            "seconds": 12.5,
            "stalled_ranks": [1],
            "note": "rank(s) 1 did not reach the gradient sync",
        },
        format="json",
    )
    assert [r.status_code for r in (restore, fallback, hang)] == [201, 201, 201]
    assert restore.json()["state"] == fallback.json()["state"] == hang.json()["state"] == "recorded"
    assert hang.json()["stalled_ranks"] == [1]
    # Only restore points are restore points: the planner reads succeeded rows.
    assert [s.kind for s in snapshots_of([job_a])[job_a.pk]] == ["snapshot"]
    found = runtime_restore_point(job=job_a)
    assert (
        found.iteration == 120
        and found.restore_seconds == pytest.approx(0.4, abs=1e-3)
        and found.restores == 1
    )
    assert found.size_bytes == 44_943_936
    # Restores, fallbacks and hangs are audited; every report is an event on the job's topic.
    assert set(AuditEntry.objects.filter(object_id=str(job_a.pk)).values_list("action", flat=True)) >= {
        "job.restore",
        "job.disk_fallback",
        "job.hang",
    }
    assert not AuditEntry.objects.filter(action="job.snapshot_report").exists()
    kinds = list(
        Event.objects.filter(topic=f"job-{job_a.pk}", kind="snapshot.reported").values_list(
            "payload__kind", flat=True
        )
    )
    assert sorted(kinds) == ["disk_fallback", "hang", "restore", "snapshot"]
    # A hang the runtime saw is the fault path's hang: a fault naming the job, on its stalled rank's node (or its
    # first); a measured restore feeds the cluster's restore estimate.
    fault = FaultEvent.objects.get(kind="hang")
    assert fault.details["job"] == job_a.pk and fault.details["stalled_ranks"] == [1]
    assert fault.node_id in set(job_a.allocations.values_list("node_id", flat=True))
    assert fault.triage["job_impact"] == "restart"
    estimate = RecoveryEstimate.objects.get(cluster=job_a.cluster, kind="restore_pause")
    assert estimate.samples == 1 and estimate.last_seconds == pytest.approx(0.4)
    # The job's own token reads nothing, here either.
    assert api.get(url).status_code == 403
    api.credentials()
    listed = api.as_token(users["tenant-viewer"]).get(url).json()
    assert {s["kind"] for s in listed} == {"snapshot", "restore", "disk_fallback", "hang"}


def test_another_jobs_token_bad_bodies_and_other_tenants(api, users, world):
    job_a, job_b = world
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job_b.token}")
    assert api.post(f"/api/v1/jobs/{job_a.pk}/snapshots/", POINT, format="json").status_code == 403
    assert (
        api.post("/api/v1/jobs/not-a-number/snapshots/", POINT, format="json").status_code == 404
    )  # no such job
    url = f"/api/v1/jobs/{job_b.pk}/snapshots/"
    bad = [
        {},
        {"kind": "snapshot"},
        {"kind": "platform", "iteration": 1},
        {"kind": "bogus", "iteration": 1},
        {"kind": "snapshot", "iteration": -1},
        {"kind": "snapshot", "iteration": "many"},
        {"kind": "snapshot", "iteration": 2**63},
        {"kind": "snapshot", "iteration": 1, "seconds": -1},
        {"kind": "snapshot", "iteration": 1, "seconds": "1e400"},
        {"kind": "snapshot", "iteration": 1, "bytes": -5},
        {"kind": "snapshot", "iteration": 1, "locations": "node0"},
        {"kind": "snapshot", "iteration": 1, "locations": [{"rank": 0, "password": "x"}]},
        {"kind": "snapshot", "iteration": 1, "locations": [{"rank": -1}]},
        {"kind": "snapshot", "iteration": 1, "locations": [{"own": "x" * 201}]},
        {"kind": "snapshot", "iteration": 1, "stalled_ranks": [1]},
        {"kind": "hang", "iteration": 1, "stalled_ranks": ["one"]},
        {"kind": "hang", "iteration": 1, "note": "x" * 301},
        [POINT],
    ]
    for body in bad:
        response = api.post(url, body, format="json")
        assert response.status_code == 400, (body, response.status_code, response.content)
    not_json = api.post(url, "{not json", content_type="application/json")
    assert not_json.status_code == 400
    assert JobSnapshot.objects.filter(job=job_b).count() == 0
    # Past the job's end, or after it ended: refused.
    job_b.total_iterations = 1000
    job_b.save(update_fields=["total_iterations"])
    assert api.post(url, dict(POINT, iteration=1001), format="json").status_code == 400
    job_b.state = JobState.COMPLETED
    job_b.save(update_fields=["state"])
    assert api.post(url, POINT, format="json").status_code == 409
    # A revoked or unknown job token is refused outright.
    api.credentials(HTTP_AUTHORIZATION="Bearer lsj_zzzzzzzz_" + "x" * 43)
    assert api.post(url, POINT, format="json").status_code == 401
    # Tenants see only their own jobs' reports; a tenant user cannot post a report (nor take a snapshot).
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job_a.token}")
    assert api.post(f"/api/v1/jobs/{job_a.pk}/snapshots/", POINT, format="json").status_code == 201
    api.credentials()
    other = api.as_token(users["other-viewer"])
    assert other.get(f"/api/v1/jobs/{job_a.pk}/snapshots/").status_code == 404
    api.credentials()
    mine = api.as_token(users["tenant-admin"])
    assert mine.post(f"/api/v1/jobs/{job_a.pk}/snapshots/", POINT, format="json").status_code == 403
    assert len(mine.get(f"/api/v1/jobs/{job_a.pk}/snapshots/").json()) == 1
