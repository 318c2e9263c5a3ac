"""Fault intake, the decision and its execution through the simulated driver, on PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.choices import AutomationMode, GPUHealth, LinkState, NodeState
from fleet.models import GPU, NIC, Node, SimulatedOperation
from jobs.choices import ActionKind, ActionState, EscalationStage, FaultState, JobState
from jobs.models import FaultEvent, JobAllocation, NodeEscalation, RecoveryAction, SpareBooking
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from jobs.services.snapshots import snapshot_take
from tests.support.factories import make_cluster
from tests.support.jobs import INSTANT, bulk_nodes, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db


def report_and_decide(**report):
    """An agent reports a fault and it is decided: the fault and the one action it was answered with."""
    fault, _ = fault_ingest(source="agent", **report)
    [action_id] = fault_handle(fault_id=fault.pk)
    return fault, RecoveryAction.objects.get(pk=action_id)


def age(job, seconds):
    """Pretend the job has been running for a while (so there is work since its last checkpoint)."""
    type(job).objects.filter(pk=job.pk).update(iteration_at=timezone.now() - timedelta(seconds=seconds))
    job.refresh_from_db()


def test_node_loss_live_migrates_to_a_spare_and_the_ledger_counts_the_saving(tenant_a):
    cluster = protected_cluster(nodes=4, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10_000)
    age(job, 1200)
    failed = node_of(job)
    fault, created = fault_ingest(source="agent", kind="node_unreachable", node=failed)
    assert created and fault.state == FaultState.NEW
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.LIVE_MIGRATION and action.state == ActionState.RUNNING
    assert action.to_node.state == NodeState.SPARE and {o["kind"] for o in action.alternatives} >= {
        "restart_from_checkpoint",
        "live_migration",
    }
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING
    assert recovery_advance()["completed"] == 1
    action.refresh_from_db()
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
    assert node_of(job).pk == action.to_node_id and node_of(job).state == NodeState.READY
    # baseline = 16 GPUs × (1200 s since checkpoint + 600 s restart overhead)
    assert action.gpu_hours_baseline == pytest.approx(16 * 1800 / 3600, rel=0.01)
    assert 0 < action.gpu_hours_lost < 0.1 and action.gpu_hours_saved == pytest.approx(
        action.gpu_hours_baseline - action.gpu_hours_lost
    )
    assert Node.objects.get(pk=failed.pk).cooldown_until > timezone.now()
    fault.refresh_from_db()
    assert fault.state == FaultState.HANDLED and "live_migration" in fault.state_reason


def test_the_same_fault_twice_is_one_fault_and_one_action(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    first, created = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=3, node=node)
    again, created_again = fault_ingest(source="alertmanager", kind="gpu_xid", xid=79, gpu_index=3, node=node)
    assert created and not created_again and again.pk == first.pk
    again.refresh_from_db()
    assert again.sources == ["agent", "alertmanager"] and again.report_count == 2
    assert len(fault_handle(fault_id=first.pk)) == 1
    assert fault_handle(fault_id=first.pk) == []
    assert RecoveryAction.objects.filter(fault=first, job=job).count() == 1
    # An API retry with the same Idempotency-Key joins the same fault, even outside the window.
    keyed, made = fault_ingest(source="api", kind="thermal", node=node, idempotency_key="abc")
    FaultEvent.objects.filter(pk=keyed.pk).update(received_at=timezone.now() - timedelta(hours=1))
    retry, made_again = fault_ingest(source="api", kind="thermal", node=node, idempotency_key="abc")
    assert made and not made_again and retry.pk == keyed.pk


def test_xid_on_one_gpu_moves_the_worker_to_a_spare_gpu_on_the_same_node(tenant_a):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=12)  # 8 + 4: the second node has 4 idle GPUs
    node = JobAllocation.objects.get(job=job, rank_start=8).node
    fault, action = report_and_decide(kind="gpu_xid", xid=95, gpu_index=1, node=node)
    assert action.kind == ActionKind.INTRA_NODE_MIGRATION and action.to_gpu_index >= 4
    assert GPU.objects.get(node=node, index=1).health == GPUHealth.FAILED
    recovery_advance()
    allocation = JobAllocation.objects.get(job=job, rank_start=8, released_at__isnull=True)
    assert 1 not in allocation.gpu_indices and action.to_gpu_index in allocation.gpu_indices


def test_nic_down_fails_over_and_the_job_runs_degraded(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection={**INSTANT, "migration_pause_seconds": 30})
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    fault, action = report_and_decide(kind="nic_down", node=node, nic_name="mlx5_2")
    assert action.kind == ActionKind.NIC_FAILOVER and action.to_nic_name == "mlx5_0"
    assert NIC.objects.get(node=node, name="mlx5_2").link_state == LinkState.DOWN
    recovery_advance()
    job.refresh_from_db()
    # Degraded until the link is healthy again and the job fails back (tests/jobs/test_signals.py).
    assert job.state == JobState.RUNNING and job.slowdown > 0 and job.degraded_until is None
    assert job.degraded_at(timezone.now() + timedelta(days=1))
    assert job.phases.filter(kind="degraded", ended_at__isnull=True, nic_name="mlx5_2").exists()


def test_unprotected_job_restarts_from_checkpoint_and_saves_nothing(tenant_a):
    cluster = make_cluster(connection=INSTANT)
    bulk_nodes(cluster, 4)
    bulk_nodes(cluster, 2, state=NodeState.SPARE)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=100)
    age(job, 250)
    fault, action = report_and_decide(kind="node_unreachable", node=node_of(job))
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and "not protected" in action.reason
    assert action.restore_iteration == 200
    recovery_advance()
    action.refresh_from_db()
    job.refresh_from_db()
    assert action.gpu_hours_saved == pytest.approx(0, abs=1e-9)
    assert job.iteration == 200 and job.state == JobState.RUNNING


def test_dry_run_decides_and_records_but_does_nothing(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT, automation=AutomationMode.DRY_RUN)
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    before = SimulatedOperation.objects.count()
    fault, action = report_and_decide(kind="node_unreachable", node=node)
    assert action.dry_run and action.kind == ActionKind.LIVE_MIGRATION and action.state == ActionState.PLANNED
    recovery_advance()
    action.refresh_from_db()
    job.refresh_from_db()
    node.refresh_from_db()
    assert (
        action.state == ActionState.PLANNED
        and job.state == JobState.RUNNING
        and node.state == NodeState.READY
    )
    assert SimulatedOperation.objects.count() == before


def test_paused_automation_holds_faults_until_resumed(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    cluster.fleet.automation = AutomationMode.PAUSED
    cluster.fleet.save()
    job = submit(cluster, tenant_a, gpus=8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    assert fault_handle(fault_id=fault.pk) == []
    fault.refresh_from_db()
    assert fault.state == FaultState.NEW and "paused" in fault.state_reason
    cluster.fleet.automation = AutomationMode.ACTIVE
    cluster.fleet.save()
    assert len(fault_handle(fault_id=fault.pk)) == 1


def test_spares_go_to_the_most_at_stake_and_the_rest_restart(tenant_a):
    cluster = protected_cluster(nodes=6, spares=2, connection=INSTANT)
    jobs = [submit(cluster, tenant_a, gpus=8 * size, checkpoint_interval=100_000) for size in (1, 2, 3)]
    for job in jobs:
        age(job, 600)
    faults = [fault_ingest(source="simulator", kind="node_unreachable", node=node_of(job))[0] for job in jobs]
    created = fault_handle(fault_id=faults[0].pk)  # one global decision over the three new faults
    assert len(created) == 3
    kinds = {a.job_id: a.kind for a in RecoveryAction.objects.filter(pk__in=created)}
    assert kinds[jobs[2].pk] == kinds[jobs[1].pk] == ActionKind.LIVE_MIGRATION
    assert kinds[jobs[0].pk] == ActionKind.RESTART_FROM_CHECKPOINT
    assert all(
        f.state == FaultState.HANDLED for f in FaultEvent.objects.filter(pk__in=[f.pk for f in faults])
    )


def test_risky_and_cooling_spares_are_never_targets(tenant_a):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    risky, cooling = bulk_nodes(cluster, 2, state=NodeState.SPARE, prefix="x")
    Node.objects.filter(pk=risky.pk).update(risk_score=0.95)
    Node.objects.filter(pk=cooling.pk).update(cooldown_until=timezone.now() + timedelta(minutes=5))
    job = submit(cluster, tenant_a, gpus=8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    [action_id] = fault_handle(fault_id=fault.pk)
    assert RecoveryAction.objects.get(pk=action_id).kind == ActionKind.RESTART_FROM_CHECKPOINT


def test_migration_budget_queues_and_beat_starts_them_as_room_frees(tenant_a):
    cluster = protected_cluster(
        nodes=4, spares=4, max_concurrent_migrations=2, connection={**INSTANT, "migration_pause_seconds": 60}
    )
    jobs = [submit(cluster, tenant_a, gpus=8, checkpoint_interval=100_000) for _ in range(4)]
    for job in jobs:
        age(job, 3600)
    faults = [fault_ingest(source="simulator", kind="node_unreachable", node=node_of(job))[0] for job in jobs]
    fault_handle(fault_id=faults[0].pk)
    actions = RecoveryAction.objects.filter(fault__in=faults)
    assert actions.filter(kind=ActionKind.LIVE_MIGRATION).count() == 4
    assert actions.filter(state=ActionState.RUNNING).count() == 2
    assert actions.filter(state=ActionState.PLANNED).count() == 2
    assert SpareBooking.objects.filter(released_at__isnull=True).count() == 4
    RecoveryAction.objects.filter(state=ActionState.RUNNING).update(done_at=timezone.now())
    SimulatedOperation.objects.update(done_at=timezone.now())
    result = recovery_advance()
    assert result["completed"] == 2 and result["started"] == 2
    assert actions.filter(state=ActionState.RUNNING).count() == 2


def test_fatal_xid_climbs_the_ladder_back_to_the_spare_pool(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    node = node_of(job)
    fault, _ = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=0, node=node)
    fault_handle(fault_id=fault.pk)
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    assert NodeEscalation.objects.get(node=node).stage == EscalationStage.QUARANTINED
    recovery_advance()  # the job's migration completes; the node drains
    recovery_advance()  # reboot is the remedy: the node is failed and waits for a human
    escalation = NodeEscalation.objects.get(node=node)
    assert escalation.stage == EscalationStage.FAILED and escalation.needs_human
    assert Node.objects.get(pk=node.pk).state == NodeState.FAILED
    assert escalation.stage == EscalationStage.FAILED
    recovery_advance()
    assert NodeEscalation.objects.get(node=node).stage == EscalationStage.FAILED  # waits for a human
    from rest_framework.test import APIClient

    from tests.support.factories import make_user, token_header

    client = APIClient()
    client.credentials(**token_header(make_user("tenant-admin", tenant_a)))
    assert client.post(
        f"/api/v1/faults/{fault.pk}/repaired/", {"reason": "x"}, format="json"
    ).status_code in (403, 404)
    client.credentials(**token_header(make_user("operator")))
    answer = client.post(f"/api/v1/faults/{fault.pk}/repaired/", {"reason": "rebooted"}, format="json")
    assert answer.status_code == 200 and answer.json()["stage"] == EscalationStage.REPAIRED
    assert client.post(f"/api/v1/faults/{fault.pk}/repaired/").status_code == 409
    recovery_advance()
    recovery_advance()
    assert NodeEscalation.objects.get(node=node).stage == EscalationStage.RETURNED
    assert Node.objects.get(pk=node.pk).state == NodeState.SPARE
    kinds = set(RecoveryAction.objects.filter(fault=fault, job__isnull=True).values_list("kind", flat=True))
    assert kinds == {"cordon", "drain", "return_to_service"}


def test_reset_remediation_and_repeated_faults_escalate(tenant_a, settings):
    cluster = protected_cluster(nodes=3, spares=1, connection=INSTANT)
    idle = Node.objects.filter(cluster=cluster, state=NodeState.READY).last()
    fault, _ = fault_ingest(source="agent", kind="gpu_xid", xid=95, gpu_index=2, node=idle)
    fault_handle(fault_id=fault.pk)
    for _ in range(5):  # drain, reset, repaired, validated, returned
        recovery_advance()
    assert NodeEscalation.objects.get(node=idle).stage == EscalationStage.RETURNED
    assert GPU.objects.get(node=idle, index=2).health == GPUHealth.HEALTHY
    # Three non-fatal faults within the window quarantine the node and move its protected job away.
    job = submit(cluster, tenant_a, gpus=8)
    node = node_of(job)
    for n, kind in enumerate(("thermal", "straggler", "thermal")):
        fault, _ = fault_ingest(source="agent", kind=kind, node=node, gpu_index=n)
        fault_handle(fault_id=fault.pk)
    assert NodeEscalation.objects.get(node=node).stage == EscalationStage.QUARANTINED
    assert RecoveryAction.objects.filter(job=job, kind=ActionKind.PROACTIVE_MIGRATION).count() == 1


def test_app_crash_restores_from_a_fresh_snapshot(tenant_a):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8, checkpoint_interval=100_000)
    age(job, 900)
    snapshot = snapshot_take(actor=None, job=job)
    recovery_advance()
    snapshot.refresh_from_db()
    assert snapshot.state == "succeeded" and snapshot.iteration >= 899
    fault, action = report_and_decide(kind="gpu_xid", xid=13, gpu_index=0, node=node_of(job))
    assert action.kind == ActionKind.RESTORE_FROM_SNAPSHOT and action.restore_iteration == snapshot.iteration
    assert GPU.objects.get(node=node_of(job), index=0).health == GPUHealth.HEALTHY  # application error only


def test_the_decision_starts_actions_through_the_driver_or_leaves_them_planned(tenant_a, monkeypatch):
    """Actions start before they are written: a started one is written running; a transient driver error leaves it
    planned with the reason, for beat to start later; a refusal fails it and frees its spare."""
    cluster = protected_cluster(nodes=4, spares=2, connection={**INSTANT, "unreachable": True})
    job = submit(cluster, tenant_a, gpus=8, checkpoint_interval=100_000)
    age(job, 3600)
    fault, action = report_and_decide(kind="node_unreachable", node=node_of(job))
    assert action.kind == ActionKind.LIVE_MIGRATION and action.state == ActionState.PLANNED
    assert "unreachable" in action.error and not SimulatedOperation.objects.filter(cluster=cluster).exists()
    assert SpareBooking.objects.filter(action=action, released_at__isnull=True).exists()
    type(cluster).objects.filter(pk=cluster.pk).update(connection=INSTANT)
    assert recovery_advance()["started"] == 1
    action.refresh_from_db()
    assert action.state in (ActionState.RUNNING, ActionState.SUCCEEDED) and action.handle.startswith("sim-")

    from fleet.drivers import DriverError
    from fleet.drivers.simulated import SimulatedDriver

    def refuse(self, *args, **kwargs):
        raise DriverError("no such worker")

    monkeypatch.setattr(SimulatedDriver, "migrate_worker", refuse)
    other = submit(cluster, tenant_a, gpus=8, checkpoint_interval=100_000)
    age(other, 3600)
    fault, action = report_and_decide(kind="node_unreachable", node=node_of(other))
    assert action.state == ActionState.FAILED and "the driver refused: no such worker" in action.error
    assert not SpareBooking.objects.filter(action=action, released_at__isnull=True).exists()


def _statements_to_decide_and_complete(tenant, faults: int) -> tuple[int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = protected_cluster(nodes=faults, spares=0, connection=INSTANT)
    jobs = [submit(cluster, tenant, gpus=8) for _ in range(faults)]
    reported = [
        fault_ingest(source="agent", kind="nic_down", nic_name="mlx5_1", node=node_of(job))[0] for job in jobs
    ]
    with CaptureQueriesContext(connection) as decided:
        assert len(fault_handle(fault_id=reported[0].pk)) == faults
    RecoveryAction.objects.update(done_at=timezone.now())
    SimulatedOperation.objects.update(done_at=timezone.now())
    with CaptureQueriesContext(connection) as completed:
        assert recovery_advance(cluster_ids=[cluster.pk])["completed"] == faults
    return len(decided), len(completed)


def test_deciding_and_completing_a_batch_costs_the_same_statements_whatever_its_size(tenant_a):
    """Per batch, not per fault: one fault more must not add a statement (an N+1 would)."""
    one = _statements_to_decide_and_complete(tenant_a, 2)
    six = _statements_to_decide_and_complete(tenant_a, 6)
    assert six[1] == one[1], f"completing: {one[1]} statements for 2 actions, {six[1]} for 6"
    # A NIC failover is one driver call per action (the simulated driver writes a row for each).
    assert six[0] - one[0] == 4, f"deciding: {one[0]} statements for 2 faults, {six[0]} for 6"


def test_phases_switch_ends_opens_and_records_in_one_go(tenant_a):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.choices import JobPhaseKind
    from jobs.models import JobPhase, JobProgress
    from jobs.services.phases import phases_switch

    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    job, other = submit(cluster, tenant_a, gpus=8), submit(cluster, tenant_a, gpus=8)
    earlier = timezone.now() - timedelta(minutes=5)
    JobPhase.objects.create(job=job, kind=JobPhaseKind.DEGRADED, started_at=earlier)
    open_before = {(p.job_id, p.kind): p.pk for p in JobPhase.objects.filter(ended_at__isnull=True)}
    at = timezone.now()
    with CaptureQueriesContext(connection) as statements:
        phases_switch(
            at=at,
            ended=[(job.pk, [JobPhaseKind.RUNNING, JobPhaseKind.RECOVERING, JobPhaseKind.DEGRADED])],
            started=[
                JobPhase(job=job, kind=JobPhaseKind.RECOVERING, started_at=at, reason="r"),
                JobPhase(job=job, kind=JobPhaseKind.DEGRADED, started_at=at, reason="d"),
            ],
            progress=[JobProgress(job=job, at=at, iteration=7)],
        )
    assert len(statements) == 1
    now_open = {(p.job_id, p.kind): p for p in JobPhase.objects.filter(ended_at__isnull=True)}
    assert set(now_open) == {
        (job.pk, JobPhaseKind.RECOVERING),
        (job.pk, JobPhaseKind.DEGRADED),
        (other.pk, JobPhaseKind.RUNNING),
    }
    assert now_open[(job.pk, JobPhaseKind.DEGRADED)].pk != open_before[(job.pk, JobPhaseKind.DEGRADED)]
    assert now_open[(other.pk, JobPhaseKind.RUNNING)].pk == open_before[(other.pk, JobPhaseKind.RUNNING)]
    assert JobPhase.objects.get(pk=open_before[(job.pk, JobPhaseKind.RUNNING)]).ended_at == at
    assert JobProgress.objects.filter(job=job, iteration=7, at=at, checkpoint=False).count() == 1
