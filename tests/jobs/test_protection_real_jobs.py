"""DESIGN's "protected" for real jobs: the cluster's policy turns the protection runtime on *and* the runtime
reports for the job; the API and the job page say which is missing. A protected real job that loses a node is
restored from its snapshot, and the ledger books what the runtime's restore report measured (no Slurm needed:
tests/slurm/test_slurm_protection.py does the same on a real Slurm)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from fleet.selectors import cluster_protection
from jobs.choices import ActionKind, ActionState, JobState
from jobs.ledger import actual_gpu_hours
from jobs.models import JobSnapshot, RecoveryAction
from jobs.protection import job_protection
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.factories import make_user
from tests.support.jobs import node_of, protect, submit
from tests.support.runtime_jobs import POINT, real_job, report, runtime_cluster

pytestmark = pytest.mark.django_db


def test_a_real_job_is_protected_only_with_the_policy_and_its_runtime_reporting(tenant_a, api, users):
    off = real_job(runtime_cluster(policy_on=False), tenant_a, api)
    verdict = job_protection(off)
    assert not verdict.protected
    assert "does not turn on the protection runtime" in verdict.reason
    assert "has not reported for this job" in verdict.reason  # both are missing: both are named

    job = real_job(runtime_cluster(), tenant_a, api)
    verdict = job_protection(job)
    assert not verdict.protected and "has not reported" in verdict.reason
    assert "does not turn on" not in verdict.reason
    point = report(api, job, iteration=495, **POINT)
    verdict = job_protection(job)
    assert verdict.protected and "reports for it (iteration 495)" in verdict.reason
    # A runtime that went quiet no longer protects the job.
    JobSnapshot.objects.filter(pk=point.pk).update(ended_at=timezone.now() - timedelta(seconds=300))
    verdict = job_protection(job)
    assert not verdict.protected and "last reported 300 s ago" in verdict.reason

    # The API and the job page say which is missing.
    operator = users["operator"]
    api.as_token(operator)
    body = api.get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["protected"] is False and "last reported" in body["protection_reason"]
    body = api.get(f"/api/v1/jobs/{off.pk}/").json()
    assert body["protected"] is False and "protection.runtime" in body["protection_reason"]
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{off.pk}/").content.decode()
    assert 'data-protected="false"' in page and "does not turn on the protection runtime" in page


def test_a_simulated_job_keeps_the_add_on_rule(tenant_a):
    cluster = runtime_cluster()
    job = submit(cluster, tenant_a, gpus=8)
    assert job.simulated and job_protection(job) == cluster_protection(cluster=cluster)
    assert not job_protection(job).protected  # the runtime policy alone does not protect a simulated job
    protect(cluster)
    verdict = job_protection(type(job).objects.get(pk=job.pk))
    assert verdict.protected and verdict.reason == "protection add-ons are InSync and Healthy"


def test_a_protected_real_job_that_loses_a_node_is_restored_and_booked_as_measured(tenant_a, api):
    cluster = runtime_cluster(nodes=3)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    report(api, job, iteration=490, overhead_seconds=0.5, **POINT)
    report(api, job, iteration=495, overhead_seconds=0.25, **POINT)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT, action.reason
    assert action.restore_iteration == 495
    assert recovery_advance()["completed"] == 1
    action.refresh_from_db()
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
    # The runtime restored a newer point than the last one it had reported (reports are coalesced).
    restore = report(
        api,
        job,
        kind="restore",
        iteration=498,
        seconds=0.3,
        bytes=8_000_000,
        locations=[{"rank": 1, "source": "replica on n1"}],
    )
    action.refresh_from_db()
    assert action.restore_iteration == 498 and action.snapshot_id == restore.pk
    work = 2 * job.seconds_per_iteration  # reached 500, restored 498, at the job's measured step time
    assert action.work_lost_seconds == pytest.approx(work)
    pause = (restore.ended_at - action.detected_at).total_seconds()
    assert action.pause_seconds == pytest.approx(pause, abs=1e-3)
    # What the snapshots cost the job while it trained up to the fault, as its runtime measured it.
    assert action.snapshot_overhead_seconds == pytest.approx(0.75)
    lost = actual_gpu_hours(gpus=16, pause_seconds=pause, work_lost_seconds=work, overhead_seconds=0.75)
    assert action.gpu_hours_lost == pytest.approx(lost)
    assert action.gpu_hours_lost > actual_gpu_hours(gpus=16, pause_seconds=pause, work_lost_seconds=work)
    assert action.gpu_hours_saved == pytest.approx(action.gpu_hours_baseline - lost)
    assert "Measured: the runtime restored iteration 498 from memory (planned 495)" in action.reason
    assert "snapshots had cost 0.8 s of training" in action.reason
    # A second restore report (the next relaunch's, or a retry) does not book this recovery again.
    report(api, job, kind="restore", iteration=520, seconds=0.3)
    action.refresh_from_db()
    assert action.restore_iteration == 498


def test_without_runtime_reports_the_real_job_restarts_from_its_checkpoint(tenant_a, api):
    cluster = runtime_cluster(nodes=3)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and action.restore_iteration == 400
    restore = next(o for o in action.alternatives if o["kind"] == "restore_from_snapshot")
    assert not restore["feasible"] and restore["why"] == "the job is not protected"


def test_a_runtime_report_not_past_the_checkpoint_still_prices_a_restore_no_worse_than_a_restart(
    tenant_a, api
):
    """The runtime's reports are coalesced: the newest may be older than the job's checkpoint while the runtime
    holds a newer restore point. The job resumes from the newer of the two, so a restore loses no more than a
    restart and is chosen (cheaper pause); the runtime's restore report then says what it really restored."""
    cluster = runtime_cluster(nodes=3)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    report(api, job, iteration=395, **POINT)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT, action.reason
    assert action.restore_iteration == 400
    options = {o["kind"]: o for o in action.alternatives}
    assert options["restore_from_snapshot"]["work_lost_seconds"] == pytest.approx(
        options["restart_from_checkpoint"]["work_lost_seconds"]
    )


def test_snapshot_overhead_is_booked_once_from_the_previous_recovery_to_the_fault(tenant_a, api, users):
    """Each runtime report carries the overhead since the one before; a recovery books what accrued between the
    job's previous recovery and its own fault, so no second of it is booked twice. The job page and the API
    show it."""
    cluster = runtime_cluster(nodes=4, spares=2)
    job = real_job(cluster, tenant_a, api, iteration=500, checkpoint=400)
    booked = []
    for round_, (overhead, restored) in enumerate(((1.5, 498), (0.5, 610))):
        report(api, job, iteration=restored - 3, overhead_seconds=overhead, **POINT)
        fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
        [action_id] = fault_handle(fault_id=fault.pk)
        assert recovery_advance()["completed"] == 1
        # Reported after the fault was detected: the next recovery's, not this one's.
        report(api, job, kind="restore", iteration=restored, seconds=0.3, overhead_seconds=None)
        action = RecoveryAction.objects.get(pk=action_id)
        assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT and action.state == ActionState.SUCCEEDED
        booked.append(action.snapshot_overhead_seconds)
        if round_ == 0:
            api.credentials(HTTP_AUTHORIZATION=f"Bearer {job.token}")
            api.post(
                f"/api/v1/jobs/{job.pk}/progress/", {"iteration": 612, "step_seconds": 0.5}, format="json"
            )
    assert booked == [pytest.approx(1.5), pytest.approx(0.5)]

    api.as_token(users["operator"])
    figures = api.get(f"/api/v1/actions/{action_id}/").json()
    assert figures["snapshot_overhead_seconds"] == pytest.approx(0.5)
    browser = Client()
    browser.force_login(make_user("operator"))
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Snapshot overhead (s)" in page and '<td class="overhead">1.5</td>' in page
