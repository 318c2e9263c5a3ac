"""Carrying recovery actions out through the cluster driver, one step per call, level-triggered by beat.

``action_start`` calls the driver and stores its handle and deadline; ``recovery_advance`` (beat) asks the
driver about running actions whose deadline passed, completes them (ledger, job state, allocations) and
starts planned ones as the migration budget frees, highest stake first. Callers hold the cluster lock.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record, audit_record_many
from controlplane.bulk import update_rows
from controlplane.errors import ServiceError
from fleet.choices import NodeState
from fleet.drivers import DriverError, driver_for
from fleet.models import Cluster
from jobs import placement
from jobs.choices import BUDGETED_KINDS, ActionKind, ActionState, JobPhaseKind, JobState
from jobs.ledger import ledger
from jobs.models import JobAllocation, RecoveryAction
from jobs.services.common import (
    action_payload,
    phase_end,
    phase_family,
    phase_start,
    phases_switch,
    publish_action,
    publish_job,
    record_progress,
)

log = logging.getLogger(__name__)

# Which driver call carries out each kind of action.
CALLS = {
    ActionKind.NIC_FAILOVER: lambda d, a: d.fail_over_nic(a.node, a.nic_name, a.to_nic_name),
    ActionKind.INTRA_NODE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.node, 1),
    ActionKind.LIVE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.to_node, _gpus_on(a)),
    ActionKind.PROACTIVE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.to_node, _gpus_on(a)),
    ActionKind.GPU_RESET: lambda d, a: d.reset_gpu(a.node, a.gpu_index or 0),
    ActionKind.RESTORE_FROM_SNAPSHOT: lambda d, a: d.restore_from_snapshot(a.job.ref, a.snapshot.handle if a.snapshot else ""),
    ActionKind.RESTART_FROM_CHECKPOINT: lambda d, a: d.restart_from_checkpoint(a.job.ref),
}


def _gpus_on(action: RecoveryAction) -> int:
    allocation = JobAllocation.objects.filter(job_id=action.job_id, node_id=action.node_id, released_at__isnull=True).first()
    return allocation.gpu_count if allocation else 1


def start_through_driver(action: RecoveryAction, cluster: Cluster, budget: placement.Budget | None) -> str:
    """Ask the driver to carry out a planned action, the migration budget permitting, and set the action's fields
    in memory (the caller writes them). Returns ``"started"`` (and counts it in ``budget``), ``"waiting"`` (over
    the budget, or a transient driver error: it stays planned and ``error`` says why) or ``"refused"`` (``error``
    says why; the caller fails it). ``budget`` is needed for the budgeted kinds only."""
    leaf = ""
    if action.kind in BUDGETED_KINDS:
        leaf = action.to_node.leaf_switch if action.to_node_id else ""
        if not budget.room(leaf):
            action.error = (f"waiting for the migration budget ({budget.cluster_running}/{budget.cluster_cap} in the "
                            f"cluster, {budget.leaf_running.get(leaf, 0)}/{budget.leaf_cap} on {leaf or 'the leaf'})")
            return "waiting"
    call = CALLS.get(action.kind)
    now = timezone.now()
    if call is None:
        result_handle, done_at = "", now
    else:
        try:
            result = call(driver_for(cluster), action)
            result_handle, done_at = result.handle, result.done_at or now
        except (DriverError, NotImplementedError) as error:
            if getattr(error, "transient", False):
                action.error = str(error)[:300]
                return "waiting"
            if action.kind != ActionKind.RESTART_FROM_CHECKPOINT:
                action.error = f"the driver refused: {error}"[:300]
                return "refused"
            # No driver support: the job's own launcher restarts it; the record stands.
            result_handle, done_at = "", now
    action.state = ActionState.RUNNING
    action.handle, action.done_at, action.started_at, action.error = result_handle, done_at, now, ""
    if action.kind in BUDGETED_KINDS:
        budget.cluster_running += 1
        budget.leaf_running[leaf] = budget.leaf_running.get(leaf, 0) + 1
    return "started"


STARTED_FIELDS = ["state", "handle", "done_at", "started_at", "error"]


def after_start(action: RecoveryAction) -> None:
    """What starting an action changes beyond the action: a proactive migration stops its running job."""
    job = action.job
    if action.kind == ActionKind.PROACTIVE_MIGRATION and job.state == JobState.RUNNING:
        now = action.started_at
        job.iteration, job.iteration_at, job.state = job.iteration_now(now), now, JobState.RECOVERING
        job.save(update_fields=["iteration", "iteration_at", "state"])
        phase_start(job, JobPhaseKind.RECOVERING, reason="proactive migration", at=now)
        record_progress(job, at=now, iteration=job.iteration)


def action_start(*, action: RecoveryAction, cluster: Cluster, publish: bool = True) -> bool:
    """Start a planned action through the driver, within the migration budgets. Returns whether it started;
    an action over budget, or refused by a transient driver error, stays planned for beat to retry."""
    if action.dry_run or action.state != ActionState.PLANNED:
        return False
    before = action.error
    budget = placement.migration_budget(cluster) if action.kind in BUDGETED_KINDS else None
    outcome = start_through_driver(action, cluster, budget)
    if outcome == "waiting":
        if action.error != before:
            RecoveryAction.objects.filter(pk=action.pk).update(error=action.error)
        return False
    if outcome == "refused":
        fail_action(action, action.error)
        return False
    action.save(update_fields=STARTED_FIELDS)
    after_start(action)
    if publish:
        publish_action(action, "action.started")
    return True


def fail_action(action: RecoveryAction, error: str) -> None:
    """The action failed (the driver refused it, or the cluster reported it failed): release its spare, say why."""
    action.state, action.error, action.ended_at = ActionState.FAILED, error[:300], timezone.now()
    action.gpu_hours_saved = 0.0
    action.save(update_fields=["state", "error", "ended_at", "gpu_hours_saved"])
    placement.release(action)
    audit_record(actor=None, action="recovery.fail", target=action, tenant_id=action.job.tenant_id if action.job_id else None,
                 changes={"error": error})
    publish_action(action, "action.failed")


def _move_allocation(action: RecoveryAction) -> None:
    rows = JobAllocation.objects.filter(job_id=action.job_id, node_id=action.node_id, released_at__isnull=True)
    if action.kind == ActionKind.INTRA_NODE_MIGRATION:
        for allocation in rows:
            allocation.gpu_indices = [action.to_gpu_index if i == action.gpu_index else i for i in allocation.gpu_indices]
            allocation.save(update_fields=["gpu_indices"])
        return
    now = timezone.now()
    for allocation in rows:
        allocation.released_at = now
        allocation.save(update_fields=["released_at"])
        JobAllocation.objects.create(job_id=action.job_id, node=action.to_node,
                                     gpu_indices=list(range(allocation.gpu_count)),
                                     rank_start=allocation.rank_start, rank_end=allocation.rank_end)


def _complete_many(actions: list[RecoveryAction]) -> None:
    """The driver finished these actions (of one cluster, its lock held): write the ledger (docs/gpu-hours.md),
    move the jobs, return them to Running. Written together: one statement per table, not per action."""
    from fleet.services.nodes import node_uncordon
    from jobs.models import Job, JobPhase, JobProgress

    now = timezone.now()
    jobs = {job.pk: job for job in Job.objects.select_for_update(of=("self",), no_key=True)
            .filter(pk__in={a.job_id for a in actions}).order_by("pk")}
    entries, degraded_jobs = [], set()
    for action in actions:
        job = jobs[action.job_id]
        overhead = action.cluster.restart_overhead_minutes * 60.0
        # The baseline was fixed when the fault was detected (stored at planning); only the actual part is measured.
        pause = max(0.0, (now - action.detected_at).total_seconds())
        work = 0.0
        degraded, slowdown = 0.0, 0.0
        if action.kind == ActionKind.RESTART_FROM_CHECKPOINT:
            pause, work = overhead, action.work_lost_seconds   # the baseline itself: nothing saved, by definition
        elif action.kind in (ActionKind.RESTORE_FROM_SNAPSHOT, ActionKind.GPU_RESET):
            work = action.work_lost_seconds
        elif action.kind == ActionKind.NIC_FAILOVER:
            degraded, slowdown = action.degraded_seconds, action.slowdown
        result = ledger(gpus=action.gpus, seconds_since_checkpoint=0, restart_overhead_seconds=0, pause_seconds=pause,
                        work_lost_seconds=work, degraded_seconds=degraded, slowdown=slowdown)
        action.pause_seconds, action.work_lost_seconds = pause, work
        action.gpu_hours_lost = result.actual
        action.gpu_hours_saved = action.gpu_hours_baseline - result.actual
        action.state, action.ended_at = ActionState.SUCCEEDED, now
        if action.kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION, ActionKind.INTRA_NODE_MIGRATION):
            _move_allocation(action)
        if action.kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION):
            placement.cool_down(action.node, settings.NODE_COOLDOWN_SECONDS)
            target = action.to_node
            if target.state == NodeState.SPARE:
                try:
                    node_uncordon(actor=None, node=target, reason=f"joined job {job.pk} as a replacement")
                except ServiceError as error:
                    log.warning("spare %s stays spare: %s", target, error.detail)
        if action.restore_iteration is not None and action.kind in (ActionKind.RESTART_FROM_CHECKPOINT,
                                                                    ActionKind.RESTORE_FROM_SNAPSHOT):
            job.iteration = action.restore_iteration
        if action.kind == ActionKind.NIC_FAILOVER:
            job.slowdown, job.degraded_until = action.slowdown, now + timedelta(seconds=action.degraded_seconds)
            degraded_jobs.add(job.pk)
        entries.append(audit_entry(actor=None, action="recovery.complete", target=action, tenant_id=job.tenant_id,
                                   changes={"gpu_hours_saved": round(action.gpu_hours_saved, 4)}))
        action.job = job
    update_rows(actions, ["pause_seconds", "work_lost_seconds", "gpu_hours_lost", "gpu_hours_saved", "state", "ended_at"])
    placement.release_many(actions)
    # A job whose other recoveries are still under way stays Recovering (proactive migrations waiting for the
    # budget do not hold it back); the others are Running again.
    still = set(RecoveryAction.objects.filter(job_id__in=jobs, dry_run=False, kind__in=list(CALLS),
                                              state__in=(ActionState.PLANNED, ActionState.RUNNING))
                .exclude(kind=ActionKind.PROACTIVE_MIGRATION, state=ActionState.PLANNED)
                .values_list("job_id", flat=True).distinct())
    recovered = {action.job_id: action.kind for action in actions
                 if jobs[action.job_id].state == JobState.RECOVERING and action.job_id not in still}
    phases_ended = [(pk, phase_family(JobPhaseKind.DEGRADED)) for pk in degraded_jobs]
    phases_ended += [(pk, phase_family(JobPhaseKind.RUNNING)) for pk in recovered]
    by_job = {action.job_id: action for action in actions}
    opened = ([JobPhase(job_id=pk, kind=JobPhaseKind.DEGRADED, started_at=now,
                        reason=f"running on {by_job[pk].to_nic_name}"[:200]) for pk in sorted(degraded_jobs)]
              + [JobPhase(job_id=pk, kind=JobPhaseKind.RUNNING, started_at=now, reason=f"recovered by {kind}"[:200])
                 for pk, kind in sorted(recovered.items())])
    for pk in recovered:
        jobs[pk].state = JobState.RUNNING
    for job in jobs.values():
        job.iteration_at = now
    update_rows(list(jobs.values()), ["iteration", "iteration_at", "state", "slowdown", "degraded_until"])
    phases_switch(at=now, ended=phases_ended, started=opened,
                  progress=[JobProgress(job=job, at=now, iteration=job.iteration) for job in jobs.values()])
    audit_record_many(entries)


def publish_completions(cluster_id: int, finished: list[RecoveryAction]) -> None:
    """``actions.completed`` lists, as recovery.decision_lists does for decisions; each action carries its
    job's new state and iteration."""
    from jobs.services.recovery import action_lists

    if not finished:
        return
    payloads = [(action, {**action_payload(action), "job_state": action.job.state, "iteration": action.job.iteration,
                          "at": action.ended_at.isoformat(), "event": "action.succeeded"})
                for action in finished]
    events.publish_many(action_lists(cluster_id, payloads, "actions.completed", "completed"))


def actions_advance(*, cluster: Cluster, action_ids: list[int], finished: list) -> int:
    """One step for running actions of one cluster (caller holds its lock): complete those the driver finished,
    fail those it failed, leave the rest running. Completed actions are appended to ``finished`` for the
    caller to publish; returns how many completed."""
    actions = list(RecoveryAction.objects.select_for_update(of=("self",), skip_locked=True, no_key=True)
                   .select_related("job", "cluster", "node", "to_node", "snapshot", "fault")
                   .filter(pk__in=action_ids, state=ActionState.RUNNING).order_by("pk"))
    now = timezone.now()
    actions = [a for a in actions if not (a.done_at and a.done_at > now)]
    try:
        statuses = driver_for(cluster).operation_statuses([a.handle for a in actions if a.handle])
    except (DriverError, NotImplementedError) as error:
        log.warning("status of %d operations on %s unknown: %s", len(actions), cluster.name, error)
        return 0
    done = []
    for action in actions:
        status = statuses.get(action.handle, "running") if action.handle else "succeeded"
        if status == "succeeded" and action.job_id:
            done.append(action)
        elif status == "succeeded":
            action.state, action.ended_at = ActionState.SUCCEEDED, timezone.now()
            action.save(update_fields=["state", "ended_at"])
            publish_action(action, "action.succeeded")
        elif status == "failed":
            fail_action(action, "the cluster reported the operation failed")
    if done:
        _complete_many(done)
        finished += done
    return len(done)


def recovery_advance(*, cluster_ids: list[int] | None = None) -> dict:
    """Beat's step for recovery: finish what the driver finished, start what the budget now allows,
    and move the escalation ladder and snapshots on. Returns counts."""
    from jobs.services.escalation import escalation_advance
    from jobs.services.snapshots import snapshots_advance

    now = timezone.now()
    active = RecoveryAction.objects.filter(dry_run=False).filter(
        Q(state=ActionState.RUNNING, done_at__lte=now) | Q(state=ActionState.PLANNED))
    if cluster_ids is not None:
        active = active.filter(cluster_id__in=cluster_ids)
    counts = {"completed": 0, "started": 0}
    # One transaction per cluster and batch of due actions; their events go out together at the end, since the
    # shared topics' sequence rows stay locked until COMMIT once taken.
    due = list(active.filter(state=ActionState.RUNNING).order_by("done_at")
               .values_list("pk", "cluster_id", "node_id", "to_node_id")[:500])
    for cluster_id in sorted({row[1] for row in due}):
        mine = [row for row in due if row[1] == cluster_id]
        for start in range(0, len(mine), 50):
            chunk = mine[start:start + 50]
            with transaction.atomic():
                cluster = placement.lock_cluster(cluster_id)
                placement.lock_nodes([n for row in chunk for n in row[2:]])
                finished: list[RecoveryAction] = []
                counts["completed"] += actions_advance(cluster=cluster, action_ids=[row[0] for row in chunk],
                                                       finished=finished)
                publish_completions(cluster_id, finished)
    for cluster_id in sorted(set(active.filter(state=ActionState.PLANNED).values_list("cluster_id", flat=True))):
        waiting = (RecoveryAction.objects.filter(cluster_id=cluster_id, state=ActionState.PLANNED, dry_run=False)
                   .order_by("-gpu_hours_at_stake", "planned_at").values_list("pk", flat=True))
        for action_id in list(waiting[:200]):
            with transaction.atomic():
                cluster = placement.lock_cluster(cluster_id)
                action = (RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
                          .select_related("job", "node", "to_node", "snapshot", "cluster").filter(pk=action_id).first())
                if action is None or action.state != ActionState.PLANNED:
                    continue
                started = action_start(action=action, cluster=cluster)
                counts["started"] += started
            if not started and action.kind in BUDGETED_KINDS:
                budget = placement.migration_budget(cluster)
                if budget.cluster_running >= budget.cluster_cap:
                    break       # the cluster's budget is full: the rest wait for the next beat
    counts["ladder"] = escalation_advance(cluster_ids=cluster_ids)
    counts["snapshots"] = snapshots_advance()
    _complete_finished_jobs()
    return counts


def _complete_finished_jobs() -> None:
    from jobs.models import Job

    for job in Job.objects.filter(simulated=True, state=JobState.RUNNING, total_iterations__isnull=False):
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
