"""One incident, one recovery that always ends: incidents from reports, one recovery per job, supersede and fall
back, deadlines, retries, and a ledger that books what happened — through the simulated driver, on PostgreSQL."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.choices import NodeState
from fleet.drivers.simulated import fail_next_recovery
from fleet.models import Node, SimulatedOperation
from jobs.choices import (
    ActionKind,
    ActionState,
    FaultKind,
    IncidentScope,
    IncidentState,
    JobState,
    SavingState,
)
from jobs.models import FaultEvent, Incident, JobAllocation, JobSnapshot, RecoveryAction, SpareBooking
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from jobs.services.incidents import incidents_sweep
from tests.support.factories import make_cluster
from tests.support.jobs import bulk_nodes, protected_cluster, submit

pytestmark = pytest.mark.django_db

INSTANT = {
    "migration_pause_seconds": 0,
    "nic_failover_seconds": 0,
    "restart_seconds": 0,
    "gpu_reset_seconds": 0,
    "snapshot_base_seconds": 0,
    "snapshot_seconds_per_gpu": 0,
}


def node_of(job, rank=0):
    return JobAllocation.objects.get(
        job=job, released_at__isnull=True, rank_start__lte=rank, rank_end__gte=rank
    ).node


def age(job, seconds):
    type(job).objects.filter(pk=job.pk).update(iteration_at=timezone.now() - timedelta(seconds=seconds))
    job.refresh_from_db()


def report(**fields):
    fault, _ = fault_ingest(source=fields.pop("source", "agent"), **fields)
    return fault


def handle(*faults):
    ids = []
    for fault in faults:
        ids += fault_handle(fault_id=fault.pk)
    return ids


REAL = {
    "migration_pause_seconds": 30,
    "nic_failover_seconds": 1,
    "restart_seconds": 60,
    "gpu_reset_seconds": 20,
    "snapshot_base_seconds": 0,
    "snapshot_seconds_per_gpu": 0,
}


def fast_forward():
    """The driver's running operations finish now (they were planned with realistic durations)."""
    now = timezone.now()
    SimulatedOperation.objects.filter(done_at__gt=now).update(done_at=now)
    RecoveryAction.objects.filter(state=ActionState.RUNNING, done_at__gt=now).update(done_at=now)


def settle(rounds=6):
    """Beat, a few times: complete what finished, fall back from what failed, start retries."""
    for _ in range(rounds):
        recovery_advance()


def recovery_of(job):
    """The job's recoveries: first attempts, and all attempts."""
    attempts = RecoveryAction.objects.filter(job=job).order_by("pk")
    return attempts.filter(previous__isnull=True), attempts


# --- incidents from reports ----------------------------------------------------------------------------------


@pytest.fixture(params=["one statement", "orm"])
def join(request, monkeypatch):
    """The incident tests run with both ways of joining: PostgreSQL's one statement, and the ORM's (SQLite)."""
    from jobs.services import incidents

    if request.param == "orm":
        monkeypatch.setattr(incidents, "_join_in_one_statement", incidents._join_with_the_orm)
    return request.param


def test_the_same_gpu_as_ecc_and_xid_48_is_one_incident_one_migration_one_spare_one_baseline(join, tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10_000)
    age(job, 900)
    node = node_of(job)
    ecc = report(kind="ecc_uncorrectable", node=node, gpu_index=3, source="simulator")
    xid = report(kind="gpu_xid", xid=48, node=node, gpu_index=3, source="agent")
    assert ecc.pk != xid.pk and ecc.incident_id == xid.incident_id
    incident = Incident.objects.get()
    assert (
        incident.kind == FaultKind.GPU_XID
        and incident.xid == 48
        and incident.fatal
        and incident.report_count == 2
    )
    handle(ecc, xid)
    first, attempts = recovery_of(job)
    assert first.count() == attempts.count() == 1
    action = first.get()
    assert action.kind == ActionKind.LIVE_MIGRATION and action.incident_id == incident.pk
    assert SpareBooking.objects.filter(released_at__isnull=True).count() == 1
    settle()
    action.refresh_from_db()
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
    assert RecoveryAction.objects.filter(job=job).count() == 1
    # One spare used (it joined the job), the other still in the pool.
    spares = Node.objects.filter(cluster=cluster, hostname__contains="-s-")
    assert sorted(spares.values_list("state", flat=True)) == [NodeState.READY, NodeState.SPARE]
    assert Node.objects.get(pk=action.to_node_id).state == NodeState.READY
    for fault in (ecc, xid):
        fault.refresh_from_db()
    assert "folded" in (ecc.state_reason + xid.state_reason)


def test_a_grey_link_that_goes_down_escalates_its_incident_and_a_second_nic_widens_it_to_the_node(
    join, tenant_a
):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    node = Node.objects.filter(cluster=cluster, state=NodeState.READY).first()
    report(kind="link_degraded", node=node, nic_name="mlx5_0")
    report(kind="nic_down", node=node, nic_name="mlx5_0")
    incident = Incident.objects.get()
    assert (incident.scope, incident.nic_name, incident.kind) == (
        IncidentScope.NIC,
        "mlx5_0",
        FaultKind.NIC_DOWN,
    )
    report(kind="nic_down", node=node, nic_name="mlx5_1")
    incident.refresh_from_db()
    assert Incident.objects.count() == 1 and (incident.scope, incident.nic_name) == (IncidentScope.NODE, "")
    assert incident.faults.count() == 3 and incident.report_count == 3


def test_an_incident_takes_the_most_severe_kind_whatever_the_order(join, tenant_a):
    cluster = make_cluster()
    node, other = bulk_nodes(cluster, 2)
    report(kind="software_crash", node=node)
    report(kind="thermal", node=node)
    report(kind="node_unreachable", node=node)
    report(kind="nic_down", node=node, nic_name="mlx5_2")
    report(kind="thermal", node=other)
    assert Incident.objects.get(node=node).kind == FaultKind.NODE_UNREACHABLE
    assert Incident.objects.get(node=other).kind == FaultKind.THERMAL


def test_a_report_after_the_window_opens_a_new_incident_unless_its_recovery_still_runs(
    join, tenant_a, settings
):
    settings.FAULT_CORRELATION_SECONDS = 5
    cluster = protected_cluster(nodes=4, spares=2, connection={**INSTANT, "migration_pause_seconds": 30})
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    first = report(kind="gpu_xid", xid=79, node=node, gpu_index=1)
    handle(first)
    late = timezone.now() - timedelta(seconds=60)
    Incident.objects.update(last_reported_at=late)
    FaultEvent.objects.update(received_at=late)
    # Its recovery (a 30 s migration) still runs: the incident is open, and a late report joins it.
    again = report(kind="node_unreachable", node=node, source="alertmanager")
    assert again.incident_id == first.incident_id
    assert incidents_sweep(now=timezone.now()) == 0
    # Once nothing runs and the window has passed, the sweep resolves it and the next report opens a new one.
    RecoveryAction.objects.filter(job=job).update(state=ActionState.SUCCEEDED, ended_at=timezone.now())
    Incident.objects.update(last_reported_at=late)
    assert incidents_sweep(now=timezone.now()) == 1
    incident = Incident.objects.get(pk=first.incident_id)
    assert incident.state == IncidentState.RESOLVED and incident.resolved_at
    fresh = report(kind="thermal", node=node)
    assert fresh.incident_id != first.incident_id


# --- one recovery per job ------------------------------------------------------------------------------------


def test_a_job_hit_on_two_nodes_in_one_decision_gets_one_restart_and_one_baseline(tenant_a):
    cluster = make_cluster(connection=INSTANT)
    bulk_nodes(cluster, 4)
    bulk_nodes(cluster, 2, state=NodeState.SPARE)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=100)
    age(job, 250)
    one, two = node_of(job, 0), node_of(job, 8)
    faults = [report(kind="node_unreachable", node=one), report(kind="node_unreachable", node=two)]
    ids = fault_handle(fault_id=faults[0].pk)
    assert len(ids) == 1 and fault_handle(fault_id=faults[1].pk) == []
    action = RecoveryAction.objects.get(pk=ids[0])
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT
    assert SimulatedOperation.objects.filter(operation="restart_from_checkpoint").count() == 1
    settle()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and RecoveryAction.objects.filter(job=job).count() == 1
    # Both failed nodes were left: the restart came back on the two spares.
    held = set(
        JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list("node_id", flat=True)
    )
    assert not held & {one.pk, two.pk} and len(held) == 2


def test_node_down_50_ms_after_xid_79_replaces_the_intra_node_move_with_one_migration(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection={**INSTANT, "migration_pause_seconds": 30})
    job = submit(cluster, tenant_a, gpus=12, checkpoint_interval=10_000)  # 8 + 4 GPUs: spare GPUs on node two
    age(job, 600)
    node = node_of(job, 8)
    xid = report(kind="gpu_xid", xid=79, node=node, gpu_index=0)
    [intra_id] = handle(xid)
    intra = RecoveryAction.objects.get(pk=intra_id)
    assert intra.kind == ActionKind.INTRA_NODE_MIGRATION and intra.state == ActionState.RUNNING
    baseline = intra.gpu_hours_baseline
    down = report(kind="node_unreachable", node=node, source="alertmanager")
    assert down.incident_id == xid.incident_id
    [live_id] = handle(down)
    intra.refresh_from_db()
    live = RecoveryAction.objects.get(pk=live_id)
    assert intra.state == ActionState.FAILED and intra.error.startswith(f"superseded by fault {down.pk}")
    assert live.kind == ActionKind.LIVE_MIGRATION and live.previous_id == intra.pk and live.attempt == 2
    assert live.detected_at == intra.detected_at  # one clock for the recovery
    assert live.gpu_hours_baseline == pytest.approx(baseline) and intra.gpu_hours_baseline == 0
    assert not SpareBooking.objects.filter(action=intra, released_at__isnull=True).exists()
    fast_forward()
    settle()
    live.refresh_from_db()
    job.refresh_from_db()
    assert live.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
    total = sum(RecoveryAction.objects.filter(job=job).values_list("gpu_hours_baseline", flat=True))
    assert total == pytest.approx(baseline)


def test_node_down_after_the_intra_node_move_finished_books_no_second_baseline(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=dict(REAL))
    job = submit(cluster, tenant_a, gpus=12, checkpoint_interval=10_000)
    age(job, 600)
    node = node_of(job, 8)
    xid = report(kind="gpu_xid", xid=79, node=node, gpu_index=0)
    [intra_id] = handle(xid)
    fast_forward()
    settle(1)
    intra = RecoveryAction.objects.get(pk=intra_id)
    assert intra.kind == ActionKind.INTRA_NODE_MIGRATION and intra.state == ActionState.SUCCEEDED
    baseline = intra.gpu_hours_baseline
    # The node dies a moment later: the same incident, so the job's move off the node books no second baseline,
    # and what it cost counts against the incident's saving.
    down = report(kind="node_unreachable", node=node, source="alertmanager")
    assert down.incident_id == xid.incident_id
    [live_id] = handle(down)
    live = RecoveryAction.objects.get(pk=live_id)
    assert live.kind == ActionKind.LIVE_MIGRATION and live.gpu_hours_baseline == 0
    assert f"action {intra.pk} booked its baseline" in live.reason
    fast_forward()
    settle(1)
    live.refresh_from_db()
    intra.refresh_from_db()
    assert live.state == ActionState.SUCCEEDED and live.gpu_hours_saved == pytest.approx(-live.gpu_hours_lost)
    assert intra.gpu_hours_baseline == pytest.approx(baseline)
    assert sum(
        RecoveryAction.objects.filter(job=job).values_list("gpu_hours_baseline", flat=True)
    ) == pytest.approx(baseline)


def test_nic_failovers_run_beside_the_jobs_own_recovery(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=dict(REAL))
    job = submit(cluster, tenant_a, gpus=16)
    one, two = node_of(job, 0), node_of(job, 8)
    faults = [
        report(kind="nic_down", node=one, nic_name="mlx5_0"),
        report(kind="nic_down", node=two, nic_name="mlx5_0"),
        report(kind="gpu_xid", xid=79, node=two, gpu_index=3),
    ]
    handle(*faults)
    kinds = sorted(RecoveryAction.objects.filter(job=job).values_list("kind", "node_id"))
    # The Xid takes node two's worker to a spare (its NIC's fault folds into that); node one fails its NIC over.
    assert kinds == sorted([(ActionKind.LIVE_MIGRATION, two.pk), (ActionKind.NIC_FAILOVER, one.pk)])
    faults[1].refresh_from_db()
    assert "folded into its recovery" in faults[1].state_reason


def test_a_failure_elsewhere_replaces_a_move_off_a_node_at_risk_with_a_recovery_of_its_own(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=dict(REAL))
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10_000)
    age(job, 600)
    at_risk, other = node_of(job, 0), node_of(job, 8)
    Node.objects.filter(pk=at_risk.pk).update(risk_score=0.9)
    [proactive_id] = handle(report(kind="predicted_failure", node=at_risk, source="predictor"))
    [live_id] = handle(report(kind="ecc_uncorrectable", node=other, gpu_index=1))
    proactive, live = RecoveryAction.objects.get(pk=proactive_id), RecoveryAction.objects.get(pk=live_id)
    assert proactive.kind == ActionKind.PROACTIVE_MIGRATION and proactive.state == ActionState.FAILED
    assert proactive.error.startswith("superseded by fault") and proactive.gpu_hours_baseline > 0
    # Not a restart of the whole job: the failed GPU's worker moves, as a recovery of its own.
    assert live.kind == ActionKind.LIVE_MIGRATION and live.node_id == other.pk and live.previous_id is None


def test_a_late_report_of_the_same_node_folds_into_the_migration_under_way(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection={**INSTANT, "migration_pause_seconds": 30})
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    [first] = handle(report(kind="node_unreachable", node=node))
    late = report(kind="gpu_xid", xid=79, node=node, gpu_index=2, source="alertmanager")
    assert handle(late) == []
    late.refresh_from_db()
    assert f"folded into its live_migration (action {first})" in late.state_reason
    assert RecoveryAction.objects.filter(job=job).count() == 1


# --- every recovery ends -------------------------------------------------------------------------------------


def _snapshot(job, iteration):
    return JobSnapshot.objects.create(
        job=job, state="succeeded", iteration=iteration, handle="snap-1", ended_at=timezone.now()
    )


@pytest.mark.parametrize(
    "kind, operation, fault, expect_next",
    [
        (
            ActionKind.NIC_FAILOVER,
            "nic_failover",
            {"kind": "nic_down", "nic_name": "mlx5_0"},
            ActionKind.LIVE_MIGRATION,
        ),
        (
            ActionKind.INTRA_NODE_MIGRATION,
            "migrate_worker",
            {"kind": "gpu_xid", "xid": 79, "gpu_index": 0},
            ActionKind.LIVE_MIGRATION,
        ),
        (
            ActionKind.LIVE_MIGRATION,
            "migrate_worker",
            {"kind": "node_unreachable"},
            ActionKind.LIVE_MIGRATION,
        ),
        (
            ActionKind.PROACTIVE_MIGRATION,
            "migrate_worker",
            {"kind": "predicted_failure", "source": "predictor"},
            ActionKind.PROACTIVE_MIGRATION,
        ),
        (
            ActionKind.RESTORE_FROM_SNAPSHOT,
            "restore_from_snapshot",
            {"kind": "software_crash"},
            ActionKind.RESTART_FROM_CHECKPOINT,
        ),
        (
            ActionKind.RESTART_FROM_CHECKPOINT,
            "restart_from_checkpoint",
            {"kind": "software_crash"},
            ActionKind.RESTART_FROM_CHECKPOINT,
        ),
    ],
)
def test_an_injected_failure_falls_back_and_the_job_runs_again(
    tenant_a, settings, kind, operation, fault, expect_next
):
    settings.RECOVERY_RETRY_BACKOFF_SECONDS = 0
    protected = kind != ActionKind.RESTART_FROM_CHECKPOINT
    cluster = (
        protected_cluster(nodes=4, spares=2, connection=dict(REAL))
        if protected
        else make_cluster(connection=dict(REAL))
    )
    if not protected:
        bulk_nodes(cluster, 4)
    gpus = 12 if kind == ActionKind.INTRA_NODE_MIGRATION else 16
    job = submit(cluster, tenant_a, gpus=gpus, checkpoint_interval=10_000)
    age(job, 600)
    node = node_of(job, 8)
    if kind == ActionKind.RESTORE_FROM_SNAPSHOT:
        _snapshot(job, job.iteration_now() - 5)
    if kind == ActionKind.PROACTIVE_MIGRATION:
        Node.objects.filter(pk=node.pk).update(risk_score=0.9)
    fail_next_recovery(cluster, count=1, operations=[operation])
    [first_id] = handle(report(node=node, **fault))
    first = RecoveryAction.objects.get(pk=first_id)
    assert first.kind == kind, first.reason
    for _ in range(4):
        fast_forward()
        settle(2)
    first.refresh_from_db()
    job.refresh_from_db()
    assert first.state == ActionState.FAILED and first.error == "the cluster reported the operation failed"
    nxt = RecoveryAction.objects.get(previous=first)
    assert nxt.kind == expect_next
    assert nxt.state == ActionState.SUCCEEDED, (nxt.kind, nxt.error)
    assert job.state == JobState.RUNNING
    if nxt.kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION) and first.to_node_id:
        assert nxt.to_node_id != first.to_node_id  # another spare
    # One baseline for the recovery, and the failed attempt's time is charged to it.
    assert first.gpu_hours_baseline == 0 and nxt.gpu_hours_baseline > 0
    assert nxt.detected_at == first.detected_at
    if kind != ActionKind.PROACTIVE_MIGRATION:
        assert nxt.pause_seconds >= (first.ended_at - first.detected_at).total_seconds()


def test_a_failed_gpu_reset_ends_with_the_node_failed_and_waiting_for_a_human(tenant_a):
    """The planner never resets a job's GPU (a reset costs a restart's overhead and more): a GPU reset is the ladder's
    remedy for a drained node. When it fails, the node is failed and waits for a repair."""
    from jobs.choices import EscalationStage
    from jobs.models import NodeEscalation

    cluster = protected_cluster(nodes=3, spares=1, connection=dict(INSTANT))
    idle = Node.objects.filter(cluster=cluster, state=NodeState.READY).last()
    fail_next_recovery(cluster, count=1, operations=["gpu_reset"])
    handle(report(kind="gpu_xid", xid=95, gpu_index=2, node=idle))
    settle(4)
    ladder = NodeEscalation.objects.get(node=idle)
    assert ladder.stage == EscalationStage.FAILED and ladder.needs_human
    assert Node.objects.get(pk=idle.pk).state == NodeState.FAILED
    assert (
        RecoveryAction.objects.get(node=idle, kind=ActionKind.GPU_RESET, job=None).state == ActionState.FAILED
    )


def test_a_refused_migration_falls_back_in_the_same_decision(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=dict(INSTANT))
    job = submit(cluster, tenant_a, gpus=16)
    fail_next_recovery(cluster, count=1, operations=["migrate_worker"], how="refuse")
    [first_id] = handle(report(kind="node_unreachable", node=node_of(job)))
    first = RecoveryAction.objects.get(pk=first_id)
    assert first.state == ActionState.FAILED and "refused" in first.error
    nxt = RecoveryAction.objects.get(previous=first)
    assert (
        nxt.kind == ActionKind.LIVE_MIGRATION
        and nxt.state == ActionState.RUNNING
        and nxt.to_node_id != first.to_node_id
    )


def test_a_failing_restart_is_retried_with_back_off_then_the_job_is_failed_and_announced(
    tenant_a, settings, users
):
    from telemetry.models import NotificationDelivery
    from telemetry.services.channels import channel_create
    from telemetry.services.notifications import notifications_dispatch

    settings.RECOVERY_RESTART_RETRIES = 2
    settings.RECOVERY_RETRY_BACKOFF_SECONDS = 30
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # a loopback hook
    channel_create(actor=users["provider-admin"], name="ops", url="http://127.0.0.1:9/hook")
    cluster = make_cluster(connection=dict(INSTANT))
    bulk_nodes(cluster, 4)
    job = submit(cluster, tenant_a, gpus=16)
    fail_next_recovery(cluster, count=10, operations=["restart_from_checkpoint"])
    handle(report(kind="software_crash", node=node_of(job)))
    settle(2)
    retry = RecoveryAction.objects.get(attempt=2)
    assert retry.state == ActionState.PLANNED and retry.retry_at > timezone.now() + timedelta(seconds=25)
    for attempt in (2, 3):
        RecoveryAction.objects.filter(attempt=attempt).update(retry_at=timezone.now())
        settle(2)
    job.refresh_from_db()
    attempts = list(
        RecoveryAction.objects.filter(job=job).order_by("attempt").values_list("attempt", "state")
    )
    assert attempts == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert job.state == JobState.FAILED and "restart from checkpoint failed 3 times" in job.state_reason
    assert not JobAllocation.objects.filter(job=job, released_at__isnull=True).exists()
    notifications_dispatch()
    assert NotificationDelivery.objects.filter(rule="job_failed").count() == 1


def test_an_action_that_runs_past_its_deadline_times_out_and_falls_back(tenant_a, settings):
    cluster = protected_cluster(nodes=4, spares=2, connection={**INSTANT, "migration_pause_seconds": 1})
    job = submit(cluster, tenant_a, gpus=16)
    [first_id] = handle(report(kind="node_unreachable", node=node_of(job)))
    first = RecoveryAction.objects.get(pk=first_id)
    # The deadline: the larger of 3 × the 1 s estimate and the estimate + 60 s.
    assert (first.deadline_at - first.started_at).total_seconds() == pytest.approx(61, abs=0.5)
    # The driver never finishes it, and its deadline passes.
    SimulatedOperation.objects.filter(pk=int(first.handle.removeprefix("sim-"))).update(
        done_at=timezone.now() + timedelta(hours=1)
    )
    RecoveryAction.objects.filter(pk=first.pk).update(done_at=timezone.now(), deadline_at=timezone.now())
    settle(1)
    first.refresh_from_db()
    assert first.state == ActionState.FAILED and first.error.startswith("timed out")
    nxt = RecoveryAction.objects.get(previous=first)
    assert nxt.kind == ActionKind.LIVE_MIGRATION and nxt.to_node_id != first.to_node_id
    job.refresh_from_db()
    assert job.state == JobState.RECOVERING


def test_past_its_deadline_an_action_falls_back_even_when_the_cluster_does_not_answer(tenant_a):
    cluster = make_cluster(connection={**INSTANT, "restart_seconds": 30})
    bulk_nodes(cluster, 4)
    job = submit(cluster, tenant_a, gpus=16)
    [first_id] = handle(report(kind="software_crash", node=node_of(job)))
    RecoveryAction.objects.filter(pk=first_id).update(done_at=timezone.now(), deadline_at=timezone.now())
    cluster.connection = {**cluster.connection, "unreachable": True}
    cluster.save(update_fields=["connection"])
    settle(1)
    first = RecoveryAction.objects.get(pk=first_id)
    assert first.state == ActionState.FAILED and first.error.startswith(
        "timed out: the cluster did not answer"
    )
    # The next attempt waits: for its back-off, and for the cluster (a transient error keeps it planned).
    nxt = RecoveryAction.objects.get(previous=first)
    assert nxt.kind == ActionKind.RESTART_FROM_CHECKPOINT and nxt.state == ActionState.PLANNED


def test_a_restarted_job_is_off_its_failed_nodes(tenant_a):
    cluster = make_cluster(connection=dict(INSTANT))
    bulk_nodes(cluster, 4)
    bulk_nodes(cluster, 1, state=NodeState.SPARE)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=100)
    age(job, 150)
    failed = node_of(job, 8)
    handle(report(kind="node_unreachable", node=failed))
    settle()
    job.refresh_from_db()
    held = JobAllocation.objects.filter(job=job, released_at__isnull=True)
    assert job.state == JobState.RUNNING and failed.pk not in held.values_list("node_id", flat=True)
    assert held.get(rank_start=8).node.state == NodeState.READY
    assert job.iteration == 100  # it lost the iterations since its checkpoint


# --- a ledger that settles ----------------------------------------------------------------------------------


def _proactive(tenant, settings):
    settings.PREDICTION_HORIZON_HOURS = 1
    cluster = protected_cluster(nodes=4, spares=2, connection=dict(INSTANT))
    job = submit(cluster, tenant, gpus=16, checkpoint_interval=10_000)
    age(job, 600)
    node = node_of(job)
    Node.objects.filter(pk=node.pk).update(risk_score=0.9)
    [action_id] = handle(report(kind="predicted_failure", node=node, source="predictor"))
    settle(2)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.PROACTIVE_MIGRATION and action.state == ActionState.SUCCEEDED
    return action, node


def test_a_proactive_move_books_expected_then_nothing_when_the_node_does_not_fail(tenant_a, settings):
    action, _ = _proactive(tenant_a, settings)
    assert action.saving == SavingState.EXPECTED and action.gpu_hours_saved == 0
    # No judged predictions yet: the stated prior (0.5) weighs the saving it would be worth.
    worth = action.gpu_hours_baseline - action.gpu_hours_lost
    assert action.gpu_hours_expected == pytest.approx(0.5 * worth) and "prior 0.50" in action.reason
    RecoveryAction.objects.filter(pk=action.pk).update(detected_at=timezone.now() - timedelta(hours=2))
    settle(1)
    action.refresh_from_db()
    assert action.saving == SavingState.NOT_REALIZED and action.gpu_hours_saved == 0


def test_a_proactive_move_settles_on_its_predictions_own_horizon(tenant_a, settings):
    """A simulated cluster's prediction states a horizon scaled to its time compression (144 s at 600x): the move
    settles on that, not on the hour of PREDICTION_HORIZON_HOURS."""
    action, _ = _proactive(tenant_a, settings)
    FaultEvent.objects.filter(pk=action.fault_id).update(details={"horizon_hours": 0.04})
    RecoveryAction.objects.filter(pk=action.pk).update(detected_at=timezone.now() - timedelta(minutes=3))
    settle(1)
    action.refresh_from_db()
    assert action.saving == SavingState.NOT_REALIZED


def test_a_proactive_move_is_realized_when_the_node_fails_within_the_horizon(tenant_a, settings):
    action, node = _proactive(tenant_a, settings)
    report(kind="node_unreachable", node=node)
    settle(1)
    action.refresh_from_db()
    assert action.saving == SavingState.REALIZED
    assert action.gpu_hours_saved == pytest.approx(action.gpu_hours_baseline - action.gpu_hours_lost)
    assert action.gpu_hours_saved > 0


def test_a_restart_books_the_pause_and_the_iterations_the_job_really_lost(tenant_a):
    cluster = make_cluster(connection={**INSTANT, "restart_seconds": 0})
    bulk_nodes(cluster, 4)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=100, seconds_per_iteration=2.0)
    age(job, 500)  # iteration 250, checkpoint 200
    [action_id] = handle(report(kind="software_crash", node=node_of(job)))
    settle()
    action = RecoveryAction.objects.get(pk=action_id)
    job.refresh_from_db()
    assert action.state == ActionState.SUCCEEDED and job.iteration == 200
    assert action.work_lost_seconds == pytest.approx(100.0, abs=2.0)  # 50 iterations of 2 s
    assert action.pause_seconds < 30  # what happened, not the 600 s restart overhead setting
    assert action.gpu_hours_saved == pytest.approx(0, abs=1e-9)
    # Its curve: flat while it was stopped, then down to the checkpoint when it restarted.
    from jobs.models import JobProgress

    curve = list(JobProgress.objects.filter(job=job).order_by("at", "id").values_list("iteration", flat=True))
    assert curve[-3:] == [250, 250, 200]
