"""Issue 49: the protection runtime's in-job reports on ``POST /api/v1/jobs/{id}/snapshots/`` (with the job token).
``peer_lost`` opens or joins the lost node's incident (source ``runtime``: one incident however many report it);
the standbys named are booked to the job (shown, and never the cluster's free spares); a malformed body is a clear
4xx with nothing written. Simulated runtime reports (tests/slurm/test_in_job_recovery.py does it on a real Slurm)."""

import time

import pytest
from django.test import Client
from django.utils import timezone

from fleet.choices import NodeState
from fleet.models import Node
from jobs import placement
from jobs.models import FaultEvent, Incident, JobAllocation, JobSnapshot, JobStandby, RecoveryAction
from tests.support.factories import make_user
from tests.support.jobs import node_of
from tests.support.runtime_jobs import POINT, real_job, registered_on, runtime_cluster

pytestmark = pytest.mark.django_db


def _post(api, job, body):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {job.token}")
    return api.post(f"/api/v1/jobs/{job.pk}/snapshots/", body, format="json")


def _free(cluster, job):
    """The cluster's nodes the job does not hold, by hostname."""
    held = {node_of(job, 0).pk, node_of(job, 8).pk}
    return [n for n in Node.objects.filter(cluster=cluster).order_by("hostname") if n.pk not in held]


BAD = [
    ({"kind": "peer_lost", "iteration": 10}, "lost_nodes"),
    ({"kind": "peer_lost", "iteration": 10, "lost_nodes": "n2"}, "lost_nodes"),
    ({"kind": "peer_lost", "iteration": 10, "lost_nodes": ["n2"], "at": "soon"}, "at"),
    ({"kind": "peer_lost", "iteration": 10, "lost_ranks": [-1]}, "lost_ranks"),
    ({"kind": "snapshot", "iteration": 10, "lost_ranks": [1]}, "lost_ranks"),
    ({"kind": "rank_replaced", "iteration": 10, "lost_ranks": [1], "to_nodes": ["n4"]}, "at"),
    (
        {"kind": "rank_replaced", "iteration": 9, "at": 1.0, "lost_ranks": [1], "to_nodes": ["n"]}
        | {"survivor_pids": {"zero": 1}},
        "survivor_pids",
    ),
    ({"kind": "snapshot", "iteration": 10, "standbys": [""]}, "standbys"),
    ({"kind": "snapshot", "iteration": 10, "standbys": [{"n": 1}]}, "standbys"),
    ({"kind": "peer_lost", "iteration": 10, "lost_nodes": ["x" * 101]}, "lost_nodes"),
]


def test_bad_in_job_reports_are_refused_clearly_and_write_nothing(tenant_a, api):
    cluster = runtime_cluster(nodes=4)
    job = real_job(cluster, tenant_a, api)
    before = JobSnapshot.objects.count()
    for body, field in BAD:
        answer = _post(api, job, body)
        assert answer.status_code == 400, (body, answer.content)
        assert field in answer.json(), (body, answer.json())
    # Well-formed, but naming no node of the job's cluster: refused, and no fault, no report half-written.
    answer = _post(api, job, {"kind": "peer_lost", "iteration": 10, "lost_nodes": ["nowhere"]})
    assert answer.status_code == 400 and "lost_nodes" in answer.json()
    # A node of the cluster the job does not hold (a spare, or another tenant's job's on a shared cluster): a job's
    # report may not open a fault on it.
    held = set(JobAllocation.objects.filter(job=job).values_list("node_id", flat=True))
    other = Node.objects.filter(cluster=cluster).exclude(pk__in=held).first()
    answer = _post(api, job, {"kind": "peer_lost", "iteration": 10, "lost_nodes": [other.hostname]})
    assert answer.status_code == 400 and "lost_nodes" in answer.json(), answer.content
    answer = _post(
        api,
        job,
        {"kind": "peer_lost", "iteration": 10, "lost_nodes": [node_of(job, 8).hostname]}
        | {"at": time.time() + 3600},
    )
    assert answer.status_code == 400 and "detected_at" in answer.json()
    assert JobSnapshot.objects.count() == before and not FaultEvent.objects.exists()


def test_peer_lost_opens_the_nodes_incident_once_whoever_reports_it(tenant_a, api):
    cluster = runtime_cluster(nodes=4)
    job = real_job(cluster, tenant_a, api)
    lost = node_of(job, 8)
    noticed = time.time() - 2
    body = {
        "kind": "peer_lost",
        "iteration": 499,
        "at": noticed,
        "lost_ranks": [1],
        "lost_nodes": [lost.hostname],
        "detail": "gloo: connection closed by peer " + "x" * 900,
        "generation": 0,
    }
    answer = _post(api, job, body)
    assert answer.status_code == 201, answer.content
    report = JobSnapshot.objects.get(pk=answer.json()["id"])
    assert report.kind == "peer_lost" and report.state == "recorded"
    assert report.details["lost_nodes"] == [lost.hostname] and len(report.details["detail"]) == 500
    fault = FaultEvent.objects.get(node=lost)
    assert fault.kind == "node_unreachable" and fault.sources == ["runtime"]
    assert abs(fault.detected_at.timestamp() - noticed) < 0.01
    # Another survivor (by rank only), then the node's agent: the same fault and incident.
    assert _post(api, job, {**body, "lost_nodes": [], "lost_ranks": [1]}).status_code == 201
    from jobs.services.faults import fault_ingest

    fault_ingest(source="agent", kind="node_unreachable", node=lost)
    fault.refresh_from_db()
    assert FaultEvent.objects.filter(node=lost).count() == 1
    assert sorted(fault.sources) == ["agent", "runtime"] and fault.report_count == 3
    assert Incident.objects.filter(node=lost).count() == 1


def test_standbys_are_booked_to_the_job_and_are_no_spares_of_the_cluster(tenant_a, api, users):
    cluster = runtime_cluster(nodes=4, spares=1)
    job = real_job(cluster, tenant_a, api)
    ready, _, spare = _free(cluster, job)
    assert spare.state == NodeState.SPARE
    names = [ready.hostname, spare.hostname]
    registered_on(job, names)
    answer = _post(api, job, {"iteration": 495, **POINT, "standbys": names, "active_nodes": ["a", "b"]})
    assert answer.status_code == 201, answer.content
    assert set(
        JobStandby.objects.filter(job=job, released_at=None).values_list("node__hostname", flat=True)
    ) == set(names)
    assert placement.SparePool(cluster).pick(near=node_of(job, 8), gpus=8) is None
    # Shown on the API and the job page.
    api.as_token(users["operator"])
    shown = api.get(f"/api/v1/jobs/{job.pk}/").json()["standbys"]
    assert sorted(s["hostname"] for s in shown) == sorted(names)
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-node="{spare.pk}">{spare.hostname}</span>' in page
    # A job registered on its whole allocation holds no rank on a standby.
    held = job.allocations.filter(released_at=None)
    assert not held.filter(node__hostname__in=names).exists() and held.count() == 2
    # A later report names fewer: the one no longer named is released, and a spare again.
    assert _post(api, job, {"iteration": 496, **POINT, "standbys": [ready.hostname]}).status_code == 201
    assert list(JobStandby.objects.filter(job=job, released_at=None).values_list("node", flat=True)) == [
        ready.pk
    ]
    assert placement.SparePool(cluster).pick(near=node_of(job, 8), gpus=8) == spare


def test_a_standby_registered_as_part_of_the_job_holds_no_rank(tenant_a, api):
    """A launcher registers the job on its whole Slurm allocation (actives and standbys): once the runtime names a
    standby, the job's allocation there is released; a rank lost later is found among the others."""
    cluster = runtime_cluster(nodes=4)
    job = real_job(cluster, tenant_a, api)
    first, second = node_of(job, 0), node_of(job, 8)
    assert _post(api, job, {"iteration": 495, **POINT, "standbys": [second.hostname]}).status_code == 201
    assert list(job.allocations.filter(released_at=None).values_list("node", flat=True)) == [first.pk]
    assert JobStandby.objects.get(job=job, released_at=None).node == second


def test_a_job_may_not_book_a_node_beyond_its_allocation_as_its_standby(tenant_a, api):
    """A runtime names its standbys; Lockstep books only nodes of the job's own allocation, or those a standby job
    Lockstep started for it runs on: naming a free spare, or another job's node, holds nothing."""
    cluster = runtime_cluster(nodes=6, spares=1)
    job = real_job(cluster, tenant_a, api)
    other = real_job(cluster, tenant_a, api)
    ready, spare = _free(cluster, job)[0], Node.objects.get(cluster=cluster, state=NodeState.SPARE)
    theirs = node_of(other, 0)
    answer = _post(api, job, {"iteration": 495, **POINT, "standbys": [ready.hostname, spare.hostname]})
    assert answer.status_code == 201, answer.content
    answer = _post(api, job, {"iteration": 496, **POINT, "standbys": [theirs.hostname]})
    assert answer.status_code == 201 and not JobStandby.objects.filter(job=job).exists()
    assert placement.SparePool(cluster).pick(near=node_of(job, 8), gpus=8) == spare
    # Where a standby job Lockstep started runs (the Slurm sync notes it on the replacement that asked for it).
    RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind="rank_replacement",
        state="succeeded",
        detected_at=timezone.now(),
        estimate={"standby": {"slurm_job_id": "77", "nodes": [ready.hostname]}},
    )
    assert _post(api, job, {"iteration": 497, **POINT, "standbys": [ready.hostname]}).status_code == 201
    assert list(JobStandby.objects.filter(job=job).values_list("node", flat=True)) == [ready.pk]
