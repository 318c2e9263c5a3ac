"""The job trains again: a restart's pause ends at the job's first training step after it, from its own progress
report, not when the scheduler says the job runs (docs/gpu-hours.md). That first step also measures what a restart
costs on the cluster for jobs of the job's size: the restart baseline (jobs.services.estimates)."""

from datetime import datetime, timedelta

from controlplane.audit import audit_record
from jobs.choices import ActionKind, ActionState
from jobs.ledger import actual_gpu_hours
from jobs.models import Job, RecoveryAction
from jobs.services.estimates import estimates_record, restart_kind
from jobs.services.publishing import publish_action

# How long after the scheduler ran a restarted job its first progress report still ends that restart's pause.
RESUME_WINDOW = timedelta(minutes=30)


def restart_resumed(*, job: Job, at: datetime, iteration: int) -> RecoveryAction | None:
    """The job (locked by the caller) reported a training step at ``at``: the restart from checkpoint Lockstep
    carried out for it, if its first step was not yet reported, books its pause until now (and, as a restart saves
    nothing, its baseline with it), and adds the fault → first step seconds to the cluster's restart measurements
    for jobs of this size. Returns the action, or None when no restart waited for this report."""
    action = (
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
        .filter(
            job=job,
            kind=ActionKind.RESTART_FROM_CHECKPOINT,
            state=ActionState.SUCCEEDED,
            dry_run=False,
            resumed_at__isnull=True,
            ended_at__lte=at,
            ended_at__gte=at - RESUME_WINDOW,
        )
        .order_by("-ended_at")
        .first()
    )
    if action is None:
        return None
    scheduled = (action.ended_at - action.detected_at).total_seconds()
    pause = max(0.0, (at - action.detected_at).total_seconds())
    action.resumed_at, action.pause_seconds = at, pause
    action.gpu_hours_lost = actual_gpu_hours(
        gpus=action.gpus, pause_seconds=pause, work_lost_seconds=action.work_lost_seconds
    )
    if action.gpu_hours_baseline > 0:
        # A restart is the baseline itself: what it cost from the fault (from its planning, when earlier attempts
        # failed first: their time shows as a negative saving).
        since = action.detected_at if action.attempt == 1 else action.planned_at
        action.gpu_hours_baseline = actual_gpu_hours(
            gpus=action.gpus,
            pause_seconds=max(0.0, (at - since).total_seconds()),
            work_lost_seconds=action.work_lost_seconds,
        )
    action.gpu_hours_saved = action.gpu_hours_baseline - action.gpu_hours_lost
    action.reason = (
        f"{action.reason} Measured: the job trained again (iteration {iteration}) {pause:.1f} s after the fault; "
        f"the scheduler ran it after {scheduled:.1f} s."
    )[:4000]
    action.save(
        update_fields=[
            "resumed_at",
            "pause_seconds",
            "gpu_hours_lost",
            "gpu_hours_baseline",
            "gpu_hours_saved",
            "reason",
        ]
    )
    estimates_record([(job.cluster_id, restart_kind(action.gpus or job.gpus), pause)])
    audit_record(
        actor=None,
        action="recovery.resumed",
        target=action,
        tenant_id=job.tenant_id,
        changes={
            "pause_seconds": round(pause, 3),
            "scheduler_seconds": round(scheduled, 3),
            "iteration": iteration,
        },
    )
    publish_action(action, "action.measured")
    return action
