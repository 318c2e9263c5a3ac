"""A spare locked for a moment by someone else's write (telemetry marking it seen, the risk sweep scoring it) is
still found: the decision waits briefly for it instead of concluding there is no spare (and restarting the job)."""

import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from fleet.choices import NodeState
from fleet.models import Node
from jobs.choices import ActionKind
from jobs.models import JobAllocation, RecoveryAction
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db(transaction=True)

INSTANT = {
    "migration_pause_seconds": 0,
    "nic_failover_seconds": 0,
    "restart_seconds": 0,
    "gpu_reset_seconds": 0,
}


def hold_row(
    node_id: int, seconds: float, held: threading.Event, release: threading.Event | None = None
) -> threading.Thread:
    """Another process's short write to a node row (what ingest's last_seen_at update does), held ``seconds``, or
    until ``release`` is set."""

    def run():
        try:
            with transaction.atomic():
                Node.objects.filter(pk=node_id).update(last_seen_at=timezone.now())
                held.set()
                (release or threading.Event()).wait(seconds)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and SKIP LOCKED are PostgreSQL's")
def test_a_node_death_migrates_to_a_spare_that_telemetry_is_writing_at_that_moment(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    [spare] = Node.objects.filter(cluster=cluster, state=NodeState.SPARE)
    node = JobAllocation.objects.filter(job=job).order_by("rank_start").first().node
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node)
    held = threading.Event()
    thread = hold_row(spare.pk, 0.15, held)
    assert held.wait(5)
    try:
        fault_handle(fault_id=fault.pk)
    finally:
        thread.join()
    action = RecoveryAction.objects.get(fault=fault, job=job)
    assert action.kind == ActionKind.LIVE_MIGRATION and action.to_node_id == spare.pk, action.reason


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and SKIP LOCKED are PostgreSQL's")
def test_a_spare_locked_for_long_is_skipped_within_the_bound(tenant_a):
    """A lock held past the bound is skipped as before: the decision does not wait long (it restarts the job)."""
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    [spare] = Node.objects.filter(cluster=cluster, state=NodeState.SPARE)
    node = JobAllocation.objects.filter(job=job).order_by("rank_start").first().node
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node)
    held, release = threading.Event(), threading.Event()
    # Held until the decision is made (60 s at most): a decision that waited for the lock would take that long.
    # Whether it gave up in time is judged by that event, not by the clock of a machine that may be loaded.
    thread = hold_row(spare.pk, 60.0, held, release)
    assert held.wait(5)
    try:
        fault_handle(fault_id=fault.pk)
        decided_while_held = thread.is_alive()
    finally:
        release.set()
        thread.join()
    kinds = list(RecoveryAction.objects.filter(fault=fault, job=job).values_list("kind", "state", "reason"))
    # (The restart itself then waits for a node to restart on: it retries with back-off.)
    assert {kind for kind, _, _ in kinds} == {ActionKind.RESTART_FROM_CHECKPOINT}, kinds
    assert decided_while_held, "the decision waited for the spare's lock to go"
