"""A real Celery worker SIGKILLed mid-way, twice: the migration still completes, exactly once."""

import threading

import psycopg
import pytest

from fleet.models import SimulatedOperation
from jobs.choices import ActionKind, ActionState, FaultState, JobState
from jobs.models import FaultEvent, JobAllocation, RecoveryAction, SpareBooking
from jobs.services.faults import fault_ingest
from jobs.tasks import fault_sweep_task, recovery_advance_task
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import celery_worker, database_url, kill_group, lock_waiters, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_worker_killed_mid_decision_and_mid_migration_completes_it_exactly_once(tmp_path, tenant_a):
    cluster = protected_cluster(
        nodes=2, spares=1, connection={"migration_pause_seconds": 4, "restart_seconds": 1}
    )
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    failed = JobAllocation.objects.get(job=job, rank_start=0).node
    # Another transaction holds the job's row, so the worker's handler blocks half-way through its decision.
    holder = psycopg.connect(database_url(), autocommit=False)
    holder.execute("SELECT id FROM jobs_job WHERE id = %s FOR UPDATE", [job.pk])

    with celery_worker(tmp_path) as worker:
        fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=failed)
        wait_for(lambda: lock_waiters() > 0, 30, what="the handler to block on the job row")
        kill_group(worker)  # dies mid-decision
    threading.Timer(0.5, holder.rollback).start()
    wait_for(lambda: lock_waiters() == 0, 30, what="the dead worker's transaction to end")
    holder.close()
    fault.refresh_from_db()
    assert fault.state == FaultState.NEW and not RecoveryAction.objects.filter(fault=fault).exists()

    with celery_worker(tmp_path) as worker:

        def started():
            fault_sweep_task.delay()  # beat: the fault is still new, so queued again
            return RecoveryAction.objects.filter(fault=fault, state=ActionState.RUNNING).exists()

        wait_for(started, 30, 0.5, what="the migration to start")
        kill_group(worker)  # dies while the migration runs
    action = RecoveryAction.objects.get(fault=fault, job=job)
    assert action.kind == ActionKind.LIVE_MIGRATION and action.state == ActionState.RUNNING

    with celery_worker(tmp_path) as worker:

        def finished():
            recovery_advance_task.delay()  # beat, level-triggered
            fault_sweep_task.delay()
            return RecoveryAction.objects.filter(pk=action.pk, state=ActionState.SUCCEEDED).exists()

        wait_for(finished, 40, 0.5, what="the migration to complete")
        log = worker.log.read_text()

    assert "Traceback" not in log, log[-2000:]
    assert RecoveryAction.objects.filter(fault=fault).exclude(job=None).count() == 1
    assert (
        SimulatedOperation.objects.filter(cluster=cluster, operation="migrate_worker", target=job.ref).count()
        == 1
    )
    assert SpareBooking.objects.filter(action=action).count() == 1
    job.refresh_from_db()
    action.refresh_from_db()
    assert job.state == JobState.RUNNING and action.gpu_hours_saved > 0
    assert (
        JobAllocation.objects.get(job=job, rank_start=0, released_at__isnull=True).node_id
        == action.to_node_id
    )
    assert FaultEvent.objects.get(pk=fault.pk).state == FaultState.HANDLED
