"""A restart that finds no healthy spare waits for one (RECOVERY_SPARE_WAIT_SECONDS) instead of failing the job.

Before, such a restart was retried three times within about four minutes and the job was Failed: a 16,384-GPU job
with its spares used up died at the next dead node, while a repaired node came back a few hours later (issue 20's
real-path replay found it at 0.5 % spares). Now the restart waits, parked: its dead node goes through the ladder to a
repair, and comes back to the job, or another node returning to service wakes it at once.
"""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from fleet.choices import NodeState
from fleet.models import Node
from jobs.choices import ActionKind, ActionState, EscalationStage, JobState
from jobs.models import JobAllocation, NodeEscalation, RecoveryAction
from jobs.services.actions import SPARE_WAIT
from jobs.services.advance import recovery_advance
from jobs.services.escalation import escalation_repaired
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.jobs import INSTANT, bulk_nodes, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db


def _lose_a_node_with_no_spare(tenant):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    job = submit(cluster, tenant, gpus=16, checkpoint_interval=10_000)
    dead = node_of(job, rank=8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=dead)
    [action_id] = fault_handle(fault_id=fault.pk)
    return cluster, job, dead, RecoveryAction.objects.get(pk=action_id)


def test_a_restart_with_no_spare_waits_and_takes_its_repaired_node_back(tenant_a, settings):
    cluster, job, dead, restart = _lose_a_node_with_no_spare(tenant_a)
    # no spare for the dead node's ranks: the restart waits for one, up to a day from the fault, looking every 5 min
    assert restart.kind == ActionKind.RESTART_FROM_CHECKPOINT and restart.state == ActionState.PLANNED
    assert restart.error.startswith(SPARE_WAIT) and "no healthy spare node" in restart.error
    now = timezone.now()
    poll, wait = (timedelta(seconds=s) for s in (settings.RECOVERY_SPARE_POLL_SECONDS, 86400))
    assert now < restart.retry_at <= now + poll
    assert restart.deadline_at == restart.detected_at + wait
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING

    # parked, the job does not hold its dead node's ladder back: the node is drained and waits for a repair
    for _ in range(3):
        recovery_advance()
    ladder = NodeEscalation.objects.get(node=dead)
    assert ladder.stage == EscalationStage.FAILED, ladder.blocked
    restart.refresh_from_db()
    assert restart.state == ActionState.PLANNED and restart.retry_at > timezone.now()

    # repaired and validated, the node goes back to the job that still holds it (not to the spare pool), and the
    # waiting restart is woken at once: it starts on the next beat and the job runs again on its own nodes
    escalation_repaired(actor=None, node=dead, reason="replaced the PSU")
    recovery_advance()
    assert NodeEscalation.objects.get(node=dead).stage == EscalationStage.RETURNED
    assert Node.objects.get(pk=dead.pk).state == NodeState.READY
    restart.refresh_from_db()
    assert restart.retry_at <= timezone.now()
    recovery_advance()
    recovery_advance()
    restart.refresh_from_db()
    job.refresh_from_db()
    assert restart.state == ActionState.SUCCEEDED, restart.error
    assert job.state == JobState.RUNNING
    assert set(
        JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list("node_id", flat=True)
    ) >= {dead.pk}
    # the wait is the recovery's: the ledger books the job's whole pause against the restart baseline
    assert restart.gpu_hours_lost > 0 and restart.gpu_hours_baseline > 0


def test_a_node_returned_to_service_wakes_a_waiting_restart(tenant_a):
    cluster, job, dead, restart = _lose_a_node_with_no_spare(tenant_a)
    # an operator adds a spare (or another repaired node comes back): it wakes the restart, which takes it
    [spare] = bulk_nodes(cluster, 1, state=NodeState.CORDONED, prefix=f"{cluster.name}-late")
    from fleet.services.nodes import node_return_to_service
    from jobs.services.actions import spares_returned

    node_return_to_service(actor=None, node=spare, reason="new node", as_spare=True)
    assert spares_returned(cluster.pk) == 1
    recovery_advance()
    recovery_advance()
    restart.refresh_from_db()
    assert restart.state == ActionState.SUCCEEDED, restart.error
    held = set(
        JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list("node_id", flat=True)
    )
    assert spare.pk in held and dead.pk not in held


def test_a_restart_waits_no_longer_than_its_bound_and_then_the_job_fails(tenant_a, settings):
    settings.RECOVERY_SPARE_WAIT_SECONDS = 600
    cluster, job, dead, restart = _lose_a_node_with_no_spare(tenant_a)
    assert restart.state == ActionState.PLANNED and restart.error.startswith(SPARE_WAIT)
    assert restart.deadline_at == restart.detected_at + timedelta(seconds=600)
    # past the bound: the waiting restart times out, its retries find no spare and wait no more, the job fails
    with time_machine.travel(timezone.now(), tick=False) as clock:
        for _ in range(12):
            clock.shift(timedelta(seconds=301))
            recovery_advance()
    job.refresh_from_db()
    assert job.state == JobState.FAILED, job.state
    attempts = RecoveryAction.objects.filter(job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT).order_by("pk")
    assert attempts[0].state == ActionState.FAILED and "not started by its deadline" in attempts[0].error
    assert all(a.state == ActionState.FAILED for a in attempts) and attempts.count() > 1
    assert not any(a.error.startswith(SPARE_WAIT) for a in attempts[1:])


def test_no_wait_when_the_bound_is_zero(tenant_a, settings):
    settings.RECOVERY_SPARE_WAIT_SECONDS = 0
    _, job, _, restart = _lose_a_node_with_no_spare(tenant_a)
    # as before: refused at once, retried after its back-off
    first = RecoveryAction.objects.filter(job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT).order_by("pk")[0]
    assert first.state == ActionState.FAILED and "no healthy spare node" in first.error
    assert not first.error.startswith(SPARE_WAIT)
