"""Moving a protected real job off a node before the node fails, where its driver cannot move one worker live but
can relaunch the job without the node (Slurm: a requeue). A ``proactive_migration`` of such a job goes in two steps:

1. **asked**: the action starts with the handle ``write-through:<job id>`` and no driver call. The answer to the
   job's progress reports says ``"write_through": true`` (``write_through_requested``), so its protection runtime
   snapshots the step it is at, writes it through to disk, reports ``write_through`` and holds there.
2. **moved**: on that report (``write_through_reported``) Lockstep relaunches the job without the node
   (``driver.relaunch_without_node``); the action finishes, like any, when the scheduler runs the job again, and
   the runtime restores the written-through step from memory, so nothing is lost. What the move really cost is
   booked from the runtime's restore report (``jobs.services.snapshots.restore_measured``), against the expected
   saving that the prediction settles.

A job that never writes through misses the action's deadline: the action fails and the fault path falls back
(the job keeps running where it is, at risk).
"""

from datetime import timedelta

from django.utils import timezone

from controlplane.audit import audit_record
from fleet.drivers import DriverError, driver_for
from fleet.drivers.base import Operation, OperationResult
from jobs import placement
from jobs.choices import ActionKind, ActionState
from jobs.models import Job, JobAllocation, JobSnapshot, RecoveryAction
from jobs.services.publishing import publish_action

WRITE_THROUGH = "write-through"


def asks_write_through(cluster) -> bool:
    """Whether a proactive move on this cluster asks the job to write through, then relaunches it."""
    supports = driver_for(cluster).supports
    return Operation.RELAUNCH_WITHOUT_NODE in supports and Operation.MIGRATE_WORKER not in supports


def move_ask(action: RecoveryAction) -> OperationResult:
    """Step 1, in place of a driver call: the job is asked (through its progress answers) to write through."""
    now = timezone.now()
    return OperationResult(
        handle=f"{WRITE_THROUGH}:{action.job_id}",
        done_at=now + timedelta(seconds=1),
        detail="asked the job to write its snapshot through",
    )


def write_through_requested(job: Job) -> bool:
    """For the answer to the job's progress report: is a move of it waiting for its write-through?"""
    return RecoveryAction.objects.filter(
        job=job,
        kind=ActionKind.PROACTIVE_MIGRATION,
        state=ActionState.RUNNING,
        dry_run=False,
        handle__startswith=f"{WRITE_THROUGH}:",
    ).exists()


def _hosts_after(action: RecoveryAction) -> list[str]:
    """The job's hosts once moved: the node it leaves replaced by the spare Lockstep booked for it."""
    hosts = (
        JobAllocation.objects.filter(job_id=action.job_id, released_at__isnull=True)
        .order_by("rank_start")
        .values_list("node_id", "node__hostname")
    )
    to = action.to_node.hostname if action.to_node_id else None
    if to is None:
        return []
    return list(dict.fromkeys(to if node_id == action.node_id else host for node_id, host in hosts))


def write_through_reported(*, job: Job, report: JobSnapshot) -> RecoveryAction | None:
    """Step 2: the runtime wrote its snapshot through at ``report.iteration``: relaunch the job without the node.
    Returns the action moved on, or None when no move was waiting for it. Runs inside the report's transaction."""
    waiting = (
        RecoveryAction.objects.filter(
            job=job,
            kind=ActionKind.PROACTIVE_MIGRATION,
            state=ActionState.RUNNING,
            dry_run=False,
            handle__startswith=f"{WRITE_THROUGH}:",
        )
        .values_list("pk", "cluster_id")
        .first()
    )
    if waiting is None:
        return None
    cluster = placement.lock_cluster(waiting[1])
    action = (
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
        .select_related("node", "to_node", "job")
        .filter(pk=waiting[0], state=ActionState.RUNNING)
        .first()
    )
    if action is None or not action.handle.startswith(f"{WRITE_THROUGH}:"):
        return None
    from jobs.services.actions import deadline_after
    from jobs.services.fallback import fail_and_fall_back

    try:
        result = driver_for(cluster).relaunch_without_node(
            job.ref, exclude=[action.node.hostname], nodes=_hosts_after(action)
        )
    except (DriverError, NotImplementedError) as error:
        fail_and_fall_back(cluster, [(action, f"the driver refused to relaunch the job: {error}")])
        return None
    now = timezone.now()
    action.handle, action.done_at = result.handle, result.done_at or now
    action.deadline_at = now + deadline_after(max(action.pause_seconds, 1.0))
    action.restore_iteration = report.iteration
    action.reason = (
        f"{action.reason} The job wrote its snapshot through at iteration {report.iteration}; "
        f"relaunched without {action.node.hostname}."
    )[:4000]
    action.save(update_fields=["handle", "done_at", "deadline_at", "restore_iteration", "reason"])
    audit_record(
        actor=None,
        action="recovery.relaunch",
        target=action,
        tenant_id=job.tenant_id,
        changes={
            "write_through_iteration": report.iteration,
            "without": action.node.hostname,
            "handle": action.handle,
        },
    )
    publish_action(action, "action.relaunched")
    return action
