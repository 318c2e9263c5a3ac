"""Beat's step for recovery, level-triggered: finish what the driver finished, fail what failed or ran past its
deadline (each falls back: ``jobs.services.fallback``), start what the budget and back-off now allow, and move
the escalation ladder, snapshots, incidents and expected savings on. Callers hold the cluster lock per batch.
"""

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from controlplane.models import AuditEntry
from fleet.drivers import DriverError, driver_for
from fleet.models import Cluster
from fleet.services import hardware
from jobs import placement
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    BUDGETED_KINDS,
    ActionKind,
    ActionState,
    JobPhaseKind,
    JobState,
    SavingState,
)
from jobs.ledger import actual_gpu_hours, expected_saving
from jobs.models import Job, JobAllocation, JobPhase, JobProgress, RecoveryAction
from jobs.services.actions import (
    CALLS,
    STARTED_FIELDS,
    WAITING_FIELDS,
    after_start,
    fail_action,
    start_through_driver,
)
from jobs.services.estimates import MEASURES, estimates_record
from jobs.services.fallback import fail_and_fall_back
from jobs.services.phases import phase_end, phase_family, phases_switch, record_progress
from jobs.services.publishing import action_lists, action_payload, publish_action, publish_job

log = logging.getLogger(__name__)

# Recoveries after which the job redoes the work since its restore point.
RESTORING_KINDS = (ActionKind.RESTART_FROM_CHECKPOINT, ActionKind.RESTORE_FROM_SNAPSHOT, ActionKind.GPU_RESET)


def _move_allocation(action: RecoveryAction) -> None:
    rows = JobAllocation.objects.filter(
        job_id=action.job_id, node_id=action.node_id, released_at__isnull=True
    )
    if action.kind == ActionKind.INTRA_NODE_MIGRATION:
        for allocation in rows:
            allocation.gpu_indices = [
                action.to_gpu_index if i == action.gpu_index else i for i in allocation.gpu_indices
            ]
            allocation.save(update_fields=["gpu_indices"])
        return
    placement.allocations_move([(allocation, action.to_node) for allocation in rows])


def book_completion(action: RecoveryAction, job, now) -> None:
    """What a finished recovery books, from what happened (docs/gpu-hours.md): the pause from detection (from its
    start for a proactive move, while the job ran until then) until the job runs again, including any failed
    attempts before it; the work redone since the restore point, as the job's own progress shows; and the slowdown
    while degraded. A restart from checkpoint saves nothing by definition: its baseline is what it cost from the
    fault (from when it was planned, when earlier attempts failed first: their time shows as a negative saving);
    one that carries no baseline (its incident's earlier recovery of the job booked it) books none. A proactive
    move books an expected saving until its prediction is settled."""
    started = action.started_at or action.detected_at
    pause = max(
        0.0,
        (
            now - (started if action.kind == ActionKind.PROACTIVE_MIGRATION else action.detected_at)
        ).total_seconds(),
    )
    work = 0.0
    if action.kind in RESTORING_KINDS and action.restore_iteration is not None:
        work = max(0, job.iteration - action.restore_iteration) * job.seconds_per_iteration
    # A failover's degraded stretch is booked as it is measured: none yet when it completes, all of it when the job
    # fails back (jobs.services.links).
    degraded, slowdown = (
        (action.degraded_seconds, action.slowdown) if action.kind == ActionKind.NIC_FAILOVER else (0.0, 0.0)
    )
    if action.kind == ActionKind.NIC_FAILOVER and action.failed_back_at is None:
        degraded = action.degraded_seconds = 0.0
    action.pause_seconds, action.work_lost_seconds = pause, work
    action.gpu_hours_lost = actual_gpu_hours(
        gpus=action.gpus,
        pause_seconds=pause,
        work_lost_seconds=work,
        degraded_seconds=degraded,
        slowdown=slowdown,
    )
    if action.kind == ActionKind.RESTART_FROM_CHECKPOINT and action.gpu_hours_baseline > 0:
        since = action.detected_at if action.attempt == 1 else action.planned_at
        action.gpu_hours_baseline = actual_gpu_hours(
            gpus=action.gpus, work_lost_seconds=work, pause_seconds=max(0.0, (now - since).total_seconds())
        )
    saving = action.gpu_hours_baseline - action.gpu_hours_lost
    if action.kind == ActionKind.PROACTIVE_MIGRATION:
        action.saving = SavingState.EXPECTED
        action.gpu_hours_expected, basis = expected_saving(saving, score=action.risk_score)
        action.gpu_hours_saved = 0.0
        action.reason = f"{action.reason} Expected saving {action.gpu_hours_expected:.2f} GPU-h: {basis}."[
            :4000
        ]
    else:
        action.gpu_hours_saved = saving


LEDGER_FIELDS = [
    "pause_seconds",
    "work_lost_seconds",
    "degraded_seconds",
    "gpu_hours_lost",
    "gpu_hours_baseline",
    "gpu_hours_saved",
    "gpu_hours_expected",
    "saving",
    "reason",
    "state",
    "ended_at",
]


def _complete_action(
    action: RecoveryAction, job: Job, now, *, measured: list, stopped_at: list, degraded_jobs: set
) -> AuditEntry:
    """One finished action of ``_complete_many``, in memory but for its allocation and node: book its ledger, mark
    it Succeeded, move its allocation, and note its duration (``measured``), the progress its job loses
    (``stopped_at``) and a job now degraded (``degraded_jobs``). Returns its audit entry."""
    book_completion(action, job, now)
    if action.kind in MEASURES and action.started_at is not None:
        measured.append((action.cluster_id, MEASURES[action.kind], (now - action.started_at).total_seconds()))
    action.state, action.ended_at = ActionState.SUCCEEDED, now
    if action.kind in (
        ActionKind.LIVE_MIGRATION,
        ActionKind.PROACTIVE_MIGRATION,
        ActionKind.INTRA_NODE_MIGRATION,
    ):
        _move_allocation(action)
    if action.kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION):
        hardware.node_cool_down(node_id=action.node_id, seconds=settings.NODE_COOLDOWN_SECONDS)
    if action.kind in RESTORING_KINDS and action.restore_iteration is not None:
        # It lost the iterations since its restore point: its curve stays flat while it was stopped, then drops.
        stopped_at.append(JobProgress(job=job, at=now, iteration=job.iteration))
        job.iteration = action.restore_iteration
    if action.kind == ActionKind.NIC_FAILOVER:
        # Degraded from now until the link is healthy again and the job fails back.
        job.slowdown, job.degraded_until = action.slowdown, None
        degraded_jobs.add(job.pk)
    entry = audit_entry(
        actor=None,
        action="recovery.complete",
        target=action,
        tenant_id=job.tenant_id,
        changes={"gpu_hours_saved": round(action.gpu_hours_saved, 4), "saving": action.saving},
    )
    action.job = job
    return entry


def _complete_many(actions: list[RecoveryAction]) -> None:
    """The driver finished these actions (of one cluster, its lock held): write the ledger, move the jobs, return
    them to Running. Written together: one statement per table, not per action."""
    now = timezone.now()
    jobs = {
        job.pk: job
        for job in Job.objects.select_for_update(of=("self",), no_key=True)
        .filter(pk__in={a.job_id for a in actions})
        .order_by("pk")
    }
    for job in jobs.values():
        job.iteration = job.iteration_now(now)  # a running job's progress so far, before its speed changes
    entries, degraded_jobs, stopped_at, measured = [], set(), [], []
    for action in actions:
        entries.append(
            _complete_action(
                action,
                jobs[action.job_id],
                now,
                measured=measured,
                stopped_at=stopped_at,
                degraded_jobs=degraded_jobs,
            )
        )
    update_rows(actions, LEDGER_FIELDS)
    estimates_record(measured)
    placement.release_many(actions)
    # A job whose other recoveries are still under way stays Recovering (proactive migrations waiting for the
    # budget do not hold it back); the others are Running again.
    still = set(
        RecoveryAction.objects.filter(
            job_id__in=jobs, dry_run=False, kind__in=list(CALLS), state__in=ACTIVE_ACTION_STATES
        )
        .exclude(kind=ActionKind.PROACTIVE_MIGRATION, state=ActionState.PLANNED)
        .values_list("job_id", flat=True)
        .distinct()
    )
    recovered = {
        action.job_id: action.kind
        for action in actions
        if jobs[action.job_id].state == JobState.RECOVERING and action.job_id not in still
    }
    phases_ended = [(pk, phase_family(JobPhaseKind.DEGRADED)) for pk in degraded_jobs]
    phases_ended += [(pk, phase_family(JobPhaseKind.RUNNING)) for pk in recovered]
    by_job = {action.job_id: action for action in actions}
    opened = [
        JobPhase(
            job_id=pk,
            kind=JobPhaseKind.DEGRADED,
            started_at=now,
            node_id=by_job[pk].node_id,
            nic_name=by_job[pk].nic_name,
            reason=f"running on {by_job[pk].to_nic_name} until {by_job[pk].nic_name} is healthy"[:200],
        )
        for pk in sorted(degraded_jobs)
    ] + [
        JobPhase(job_id=pk, kind=JobPhaseKind.RUNNING, started_at=now, reason=f"recovered by {kind}"[:200])
        for pk, kind in sorted(recovered.items())
    ]
    for pk in recovered:
        jobs[pk].state = JobState.RUNNING
    for job in jobs.values():
        job.iteration_at = now
    update_rows(list(jobs.values()), ["iteration", "iteration_at", "state", "slowdown", "degraded_until"])
    phases_switch(
        at=now,
        ended=phases_ended,
        started=opened,
        progress=stopped_at
        + [JobProgress(job=job, at=now, iteration=job.iteration) for job in jobs.values()],
    )
    audit_record_many(entries)


def publish_completions(cluster_id: int, finished: list[RecoveryAction]) -> None:
    """``actions.completed`` lists, as decisions publish ``actions.decided``; each action carries its job's new
    state and iteration."""
    if not finished:
        return
    payloads = [
        (
            action,
            {
                **action_payload(action),
                "job_state": action.job.state,
                "iteration": action.job.iteration,
                "at": action.ended_at.isoformat(),
                "event": "action.succeeded",
            },
        )
        for action in finished
    ]
    events.publish_many(action_lists(cluster_id, payloads, "actions.completed", "completed"))


def actions_advance(*, cluster: Cluster, action_ids: list[int], finished: list) -> int:
    """One step for running actions of one cluster (caller holds its lock): complete those the driver finished,
    fail those it failed or that ran past their deadline (each falls back), leave the rest running. Completed
    actions are appended to ``finished`` for the caller to publish; returns how many completed."""
    actions = list(
        RecoveryAction.objects.select_for_update(of=("self",), skip_locked=True, no_key=True)
        .select_related("job", "node", "to_node", "snapshot", "fault")
        .filter(pk__in=action_ids, cluster_id=cluster.pk, state=ActionState.RUNNING)
        .order_by("pk")
    )
    for action in actions:
        action.cluster = (
            cluster  # the row the caller locked (not read again, nor its connection decrypted per action)
        )
    now = timezone.now()
    actions = [a for a in actions if not (a.done_at and a.done_at > now)]
    try:
        statuses = driver_for(cluster).operation_statuses([a.handle for a in actions if a.handle])
    except (DriverError, NotImplementedError) as error:
        log.warning("status of %d operations on %s unknown: %s", len(actions), cluster.name, error)
        # Every recovery ends, whether or not the cluster answers: past its deadline an action falls back.
        overdue = [
            (a, f"timed out: the cluster did not answer ({error})")
            for a in actions
            if a.deadline_at and a.deadline_at <= now
        ]
        if overdue:
            fail_and_fall_back(cluster, overdue)
        return 0
    done, failed = [], []
    for action in actions:
        status = statuses.get(action.handle, "running") if action.handle else "succeeded"
        if action.kind == ActionKind.RANK_REPLACEMENT:
            status = (
                "running"  # the runtime's rank_replaced report completes it (jobs.services.rank_replacement)
            )
        if status == "succeeded" and action.job_id:
            done.append(action)
        elif status == "succeeded":
            action.state, action.ended_at = ActionState.SUCCEEDED, timezone.now()
            action.save(update_fields=["state", "ended_at"])
            publish_action(action, "action.succeeded")
        elif status == "failed" and not action.job_id:
            fail_action(action, "the cluster reported the operation failed")
        elif status == "failed":
            failed.append((action, "the cluster reported the operation failed"))
        elif action.deadline_at and action.deadline_at <= now:
            took = (now - (action.started_at or now)).total_seconds()
            failed.append(
                (action, f"timed out: still running {took:.0f} s after it started (its deadline passed)")
            )
    if done:
        _complete_many(done)
        finished += done
    if failed:
        fail_and_fall_back(cluster, failed)
    return len(done)


def action_start(*, action: RecoveryAction, cluster: Cluster, publish: bool = True) -> bool:
    """Start a planned action through the driver, within the migration budgets. Returns whether it started;
    an action over budget, or refused by a transient driver error, stays planned for beat to retry."""
    if action.dry_run or action.state != ActionState.PLANNED:
        return False
    before = [getattr(action, name) for name in WAITING_FIELDS]
    budget = placement.migration_budget(cluster) if action.kind in BUDGETED_KINDS else None
    outcome = start_through_driver(action, cluster, budget)
    if outcome == "waiting":
        if [getattr(action, name) for name in WAITING_FIELDS] != before:
            action.save(update_fields=WAITING_FIELDS)
        return False
    if outcome == "refused":
        fail_and_fall_back(cluster, [(action, action.error)])
        return False
    action.save(update_fields=STARTED_FIELDS)
    after_start(action)
    if publish:
        publish_action(action, "action.started")
    return True


def recovery_advance(*, cluster_ids: list[int] | None = None) -> dict:
    """Beat's step for recovery: finish what the driver finished, fail what is past its deadline, start what the
    budget and back-off now allow, and move the escalation ladder, snapshots, incidents and savings on."""
    from jobs.services.escalation import escalation_advance
    from jobs.services.incidents import incidents_sweep
    from jobs.services.rank_replacement import standbys_replenish
    from jobs.services.savings import savings_settle
    from jobs.services.snapshots import snapshots_advance

    now = timezone.now()
    active = RecoveryAction.objects.filter(dry_run=False).filter(
        Q(state=ActionState.RUNNING, done_at__lte=now) | Q(state=ActionState.PLANNED)
    )
    if cluster_ids is not None:
        active = active.filter(cluster_id__in=cluster_ids)
    counts = {"completed": 0, "started": 0, "failed": 0}
    # One transaction per cluster and batch of due actions; their events go out together at the end, since the
    # shared topics' sequence rows stay locked until COMMIT once taken.
    due = list(
        active.filter(state=ActionState.RUNNING)
        .order_by("done_at")
        .values_list("pk", "cluster_id", "node_id", "to_node_id")[:500]
    )
    for cluster_id in sorted({row[1] for row in due}):
        mine = [row for row in due if row[1] == cluster_id]
        for start in range(0, len(mine), 50):
            chunk = mine[start : start + 50]
            with transaction.atomic():
                cluster = placement.lock_cluster(cluster_id)
                placement.lock_nodes([n for row in chunk for n in row[2:]])
                finished: list[RecoveryAction] = []
                counts["completed"] += actions_advance(
                    cluster=cluster, action_ids=[row[0] for row in chunk], finished=finished
                )
                publish_completions(cluster_id, finished)
    planned = active.filter(state=ActionState.PLANNED).filter(Q(retry_at__isnull=True) | Q(retry_at__lte=now))
    for cluster_id in sorted(set(planned.values_list("cluster_id", flat=True))):
        waiting = (
            RecoveryAction.objects.filter(cluster_id=cluster_id, state=ActionState.PLANNED, dry_run=False)
            .filter(Q(retry_at__isnull=True) | Q(retry_at__lte=now))
            .order_by("-gpu_hours_at_stake", "planned_at")
            .values_list("pk", flat=True)
        )
        for action_id in list(waiting[:200]):
            with transaction.atomic():
                cluster = placement.lock_cluster(cluster_id)
                action = (
                    RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
                    .select_related("job", "node", "to_node", "snapshot", "cluster", "fault")
                    .filter(pk=action_id)
                    .first()
                )
                if action is None or action.state != ActionState.PLANNED:
                    continue
                if action.deadline_at and action.deadline_at <= timezone.now():
                    fail_and_fall_back(
                        cluster,
                        [(action, f"timed out: not started by its deadline ({action.error or 'waiting'})")],
                    )
                    counts["failed"] += 1
                    continue
                started = action_start(action=action, cluster=cluster)
                counts["started"] += started
            if not started and action.kind in BUDGETED_KINDS:
                budget = placement.migration_budget(cluster)
                if budget.cluster_running >= budget.cluster_cap:
                    break  # the cluster's budget is full: the rest wait for the next beat
    counts["ladder"] = escalation_advance(cluster_ids=cluster_ids)
    counts["snapshots"] = snapshots_advance()
    counts["standbys"] = standbys_replenish()
    counts["incidents"] = incidents_sweep(now=now)
    counts["settled"] = savings_settle(now=now)
    _complete_finished_jobs()
    return counts


def _complete_finished_jobs() -> None:
    for job in Job.objects.filter(
        reports_progress=False, state=JobState.RUNNING, total_iterations__isnull=False
    ):
        if job.iteration_now() >= job.total_iterations:
            with transaction.atomic():
                locked = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
                if locked.state != JobState.RUNNING:
                    continue
                now = timezone.now()
                locked.iteration, locked.iteration_at = locked.iteration_now(now), now
                locked.state, locked.ended_at = JobState.COMPLETED, now
                locked.save(update_fields=["iteration", "iteration_at", "state", "ended_at"])
                JobAllocation.objects.filter(job=locked, released_at__isnull=True).update(released_at=now)
                phase_end(locked, at=now)
                record_progress(locked, at=now, iteration=locked.iteration)
                publish_job(locked, "job.state")
