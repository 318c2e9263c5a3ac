"""Issue 49: rank_replacement, priced beside the other recoveries and chosen for a protected job that loses a node
while it has a live standby; carried out through the driver (the lost node drained, no requeue); booked from the
runtime's ``rank_replaced`` report (pause from the first report of the fault to the first step after, work lost =
steps redone × step time); a new standby asked for afterwards; without the report by its deadline it falls back to
restoring the whole job, in the same incident. The driver here is the instant simulated one taught the two calls
(tests/slurm/test_in_job_recovery.py does it on a real Slurm)."""

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.drivers.base import OperationResult
from fleet.drivers.simulated import SimulatedDriver
from jobs.choices import ActionKind, ActionState, JobState
from jobs.ledger import actual_gpu_hours
from jobs.models import JobStandby, RecoveryAction, RecoveryEstimate
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.factories import make_user
from tests.support.jobs import node_of
from tests.support.runtime_jobs import POINT, real_job, registered_on, report, runtime_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def driver_calls(monkeypatch):
    calls = []

    def replace_rank(self, job_ref, node):
        calls.append(("replace_rank", job_ref, node.hostname))
        return OperationResult(handle=f"replace:1:{node.hostname}", done_at=timezone.now())

    def replenish_standby(self, job_ref, node=None):
        calls.append(("replenish_standby", job_ref))
        return OperationResult(handle="standby:2:1", done_at=timezone.now(), detail="standby job 2")

    monkeypatch.setattr(SimulatedDriver, "replace_rank", replace_rank, raising=False)
    monkeypatch.setattr(SimulatedDriver, "replenish_standby", replenish_standby, raising=False)
    return calls


def _protected_with_standby(tenant_a, api):
    cluster = runtime_cluster(nodes=5)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    held = {node_of(job, 0).hostname, node_of(job, 8).hostname}
    standby, other = sorted(n.hostname for n in cluster.nodes.all() if n.hostname not in held)[:2]
    registered_on(job, [standby, other])
    report(api, job, iteration=499, **POINT, standbys=[standby, other])
    return cluster, job, standby, other


def _lose_node(job):
    lost = node_of(job, 8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=lost)
    [action_id] = fault_handle(fault_id=fault.pk)
    return lost, RecoveryAction.objects.get(pk=action_id)


def test_a_node_loss_with_a_standby_is_answered_by_rank_replacement(tenant_a, api, users, driver_calls):
    cluster, job, standby, other = _protected_with_standby(tenant_a, api)
    lost, action = _lose_node(job)
    assert action.kind == ActionKind.RANK_REPLACEMENT, action.reason
    options = {o["kind"]: o for o in action.alternatives}
    assert (
        options["rank_replacement"]["pause_seconds"] == 5.0
        and "live standby" in options["rank_replacement"]["why"]
    )
    assert options["restore_from_snapshot"]["feasible"]  # priced beside it
    assert action.state == ActionState.RUNNING and driver_calls == [("replace_rank", job.ref, lost.hostname)]
    assert (action.deadline_at - action.started_at).total_seconds() == pytest.approx(60.0)
    # Beat waits for the runtime: the driver's operation does not end it.
    recovery_advance()
    action.refresh_from_db()
    assert action.state == ActionState.RUNNING
    # The runtime reports the standby in place after its first step.
    time.sleep(0.2)
    fault_at, at = action.detected_at.timestamp() + 0.05, time.time()
    replaced = report(
        api,
        job,
        kind="rank_replaced",
        iteration=498,
        at=at,
        fault_at=fault_at,
        lost_ranks=[1],
        from_nodes=[lost.hostname],
        to_nodes=[standby],
        lost_iterations=2,
        reached=500,
        generation=1,
        standbys_left=[other],
        survivor_pids={"0": 1234},
        seconds=2.0,
    )
    action.refresh_from_db()
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
    assert action.snapshot_id == replaced.pk and action.restore_iteration == 498
    earliest = min(action.detected_at, action.incident.opened_at)
    assert action.pause_seconds == pytest.approx(at - earliest.timestamp(), abs=1e-3)
    assert action.work_lost_seconds == pytest.approx(2 * job.seconds_per_iteration)
    assert action.gpu_hours_lost == pytest.approx(
        actual_gpu_hours(
            gpus=16, pause_seconds=action.pause_seconds, work_lost_seconds=action.work_lost_seconds
        ),
        rel=1e-3,
    )
    assert action.gpu_hours_saved == pytest.approx(action.gpu_hours_baseline - action.gpu_hours_lost)
    assert action.resumed_at.timestamp() == pytest.approx(at, abs=1e-3)
    # The rank moved to the standby's node; the standby used is no longer one; a new one was asked for.
    assert node_of(job, 8).hostname == standby
    assert list(
        JobStandby.objects.filter(job=job, released_at=None).values_list("node__hostname", flat=True)
    ) == [other]
    # Beat asks the driver for a new standby, once.
    assert driver_calls[-1][0] == "replace_rank"
    assert recovery_advance()["standbys"] == 1 and recovery_advance()["standbys"] == 0
    assert driver_calls[-1] == ("replenish_standby", job.ref) and len(driver_calls) == 2
    action.refresh_from_db()
    assert "Standbys: new standby asked for: standby job 2." in action.reason
    assert action.estimate["standby"]["outcome"] == "new standby asked for: standby job 2"
    measured = RecoveryEstimate.objects.get(cluster=cluster, kind="rank_replacement_pause")
    assert measured.samples == 1 and measured.seconds == pytest.approx(at - fault_at, abs=1e-3)
    # The job page shows the standby and the replacement.
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "rank_replacement" in page and other in page
    steps = page[page.index('id="recovery-step-table"') :]
    for step in ("detect", "decide", "replace", "training again"):
        assert f'data-step="{step}"' in steps


def test_without_the_runtimes_report_it_falls_back_to_a_restore_in_the_same_incident(
    tenant_a, api, driver_calls
):
    _, job, _, _ = _protected_with_standby(tenant_a, api)
    _, action = _lose_node(job)
    assert action.kind == ActionKind.RANK_REPLACEMENT
    RecoveryAction.objects.filter(pk=action.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    recovery_advance()
    action.refresh_from_db()
    assert action.state == ActionState.FAILED and "timed out" in action.error
    [after] = RecoveryAction.objects.filter(previous=action)
    assert after.kind == ActionKind.RESTORE_FROM_SNAPSHOT and after.incident_id == action.incident_id
    # One incident, one recovery: the baseline moved to the attempt that replaced it, booked once.
    assert after.gpu_hours_baseline > 0 and action.gpu_hours_baseline == 0


def test_no_live_standby_means_no_rank_replacement(tenant_a, api, driver_calls):
    cluster = runtime_cluster(nodes=4)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    report(api, job, iteration=499, **POINT, standbys=[])
    _, action = _lose_node(job)
    assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT
    why = {o["kind"]: o["why"] for o in action.alternatives}["rank_replacement"]
    assert why == "no live standby in the job's allocation"


def test_a_replacement_reported_before_lockstep_decided_is_recorded_in_the_incident(
    tenant_a, api, driver_calls
):
    _, job, standby, other = _protected_with_standby(tenant_a, api)
    lost = node_of(job, 8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=lost)  # not handled yet
    time.sleep(0.1)
    report(
        api,
        job,
        kind="rank_replaced",
        iteration=498,
        at=time.time(),
        fault_at=fault.detected_at.timestamp(),
        lost_ranks=[1],
        from_nodes=[lost.hostname],
        to_nodes=[standby],
        lost_iterations=2,
        standbys_left=[other],
    )
    [action] = RecoveryAction.objects.filter(job=job)
    assert action.kind == ActionKind.RANK_REPLACEMENT and action.state == ActionState.SUCCEEDED
    assert action.incident_id == fault.incident_id and action.gpu_hours_baseline > 0
    assert action.estimate["restart_overhead"]["basis"] == "assumed"
    assert 0 < action.pause_seconds < 30 and action.gpu_hours_saved > 0
    assert node_of(job, 8).hostname == standby
    recovery_advance()
    assert driver_calls[-1] == ("replenish_standby", job.ref)
    # Lockstep's decision then finds the job off the lost node: no second recovery.
    assert fault_handle(fault_id=fault.pk) == []
    assert RecoveryAction.objects.filter(job=job).count() == 1
