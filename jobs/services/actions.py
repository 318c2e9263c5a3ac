"""Starting and failing recovery actions through the cluster driver. Callers hold the cluster lock.

``start_through_driver`` calls the driver and sets the handle, expected end and deadline (``deadline_after``);
a failed action releases its spare and says why. What follows a failure (the next attempt) is ``jobs.services.fallback``;
beat's step for running actions is ``jobs.services.advance``.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from fleet.drivers import DriverError, driver_for
from fleet.models import Cluster
from jobs import placement
from jobs.choices import BUDGETED_KINDS, ActionKind, ActionState, EscalationStage, JobPhaseKind, JobState
from jobs.models import JobAllocation, NodeEscalation, RecoveryAction
from jobs.planner import WHOLE_JOB_KINDS
from jobs.services.phases import phase_start, record_progress
from jobs.services.publishing import publish_action

log = logging.getLogger(__name__)


def deadline_after(estimate_seconds: float) -> timedelta:
    """How long an action may take before it counts as failed (timed out): the larger of
    RECOVERY_DEADLINE_FACTOR × its estimate and the estimate + RECOVERY_DEADLINE_EXTRA_SECONDS."""
    estimate = max(0.0, estimate_seconds)
    return timedelta(
        seconds=max(
            settings.RECOVERY_DEADLINE_FACTOR * estimate, estimate + settings.RECOVERY_DEADLINE_EXTRA_SECONDS
        )
    )


# Which driver call carries out each kind of action.
CALLS = {
    ActionKind.NIC_FAILOVER: lambda d, a: d.fail_over_nic(a.node, a.nic_name, a.to_nic_name),
    ActionKind.INTRA_NODE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.node, 1),
    ActionKind.LIVE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.to_node, _gpus_on(a)),
    ActionKind.PROACTIVE_MIGRATION: lambda d, a: d.migrate_worker(a.job.ref, a.node, a.to_node, _gpus_on(a)),
    ActionKind.GPU_RESET: lambda d, a: d.reset_gpu(a.node, a.gpu_index or 0),
    ActionKind.RESTORE_FROM_SNAPSHOT: lambda d, a: d.restore_from_snapshot(
        a.job.ref, a.snapshot.handle if a.snapshot else ""
    ),
    ActionKind.RESTART_FROM_CHECKPOINT: lambda d, a: d.restart_from_checkpoint(a.job.ref),
    # The driver takes the lost node out of the job's scheduler (Slurm: drained, no requeue); the job's runtime
    # puts a standby in the lost rank's place and reports it (jobs.services.rank_replacement).
    ActionKind.RANK_REPLACEMENT: lambda d, a: d.replace_rank(a.job.ref, a.node),
}


def _gpus_on(action: RecoveryAction) -> int:
    allocation = JobAllocation.objects.filter(
        job_id=action.job_id, node_id=action.node_id, released_at__isnull=True
    ).first()
    return allocation.gpu_count if allocation else 1


def start_through_driver(
    action: RecoveryAction,
    cluster: Cluster,
    budget: placement.Budget | None,
    taken: set[int] | None = None,
    pool: placement.SparePool | None = None,
) -> str:
    """Ask the driver to carry out a planned action, the migration budget permitting, and set the action's fields
    in memory (the caller writes them). Returns ``"started"`` (and counts it in ``budget``), ``"waiting"`` (over
    the budget, a transient driver error, or a restart waiting for a spare: it stays planned and ``error`` says
    why; ``WAITING_FIELDS`` are what may have changed) or ``"refused"`` (``error`` says why; the caller fails it).
    ``budget`` is needed for the budgeted kinds only. A whole-job restart first finds healthy spares for its
    workers on failed or quarantined nodes (never one in ``taken``, the spares this decision already handed out)
    and moves them there once the driver has started it; with none it waits for one (``_wait_for_spare``). A
    decision passes its own spare ``pool`` (read and locked once for all its actions; a storm's 64 restarts would
    otherwise each read the spares afresh, twice, and wait for their locks each time)."""
    moves = []
    if action.kind in WHOLE_JOB_KINDS:  # it comes back off every failed or quarantined node
        taken = taken if taken is not None else set()
        pool = pool if pool is not None else placement.SparePool(cluster)
        moves, problem = [], "no dead node"
        if action.impact == "node" and action.node_id and not _returned_since(action):
            # The node is dead even while Lockstep may not take it out of service yet (a fleet-wide cap): a spare
            # for its workers too, where there is one, so that the scheduler cannot hand out one booked for another.
            # (Unless the restart waited and the node came back repaired meanwhile: then it is the job's again.)
            moves, problem = placement.replacements(action.job, pool, taken, gone=frozenset({action.node_id}))
        if problem:
            moves, problem = placement.replacements(action.job, pool, taken)
        if problem:
            return _wait_for_spare(action, problem)
    leaf = ""
    if action.kind in BUDGETED_KINDS:
        leaf = action.to_node.leaf_switch if action.to_node_id else ""
        if not budget.room(leaf):
            action.error = (
                f"waiting for the migration budget ({budget.cluster_running}/{budget.cluster_cap} in the "
                f"cluster, {budget.leaf_running.get(leaf, 0)}/{budget.leaf_cap} on {leaf or 'the leaf'})"
            )
            return "waiting"
    call = CALLS.get(action.kind)
    now = timezone.now()
    if call is None:
        result_handle, done_at = "", now
    else:
        try:
            result = _driver_start(action, cluster, call, moves)
            result_handle, done_at = result.handle, result.done_at or now
        except (DriverError, NotImplementedError) as error:
            if getattr(error, "transient", False):
                action.error = str(error)[:300]
                return "waiting"
            if action.kind != ActionKind.RESTART_FROM_CHECKPOINT:
                action.error = f"the driver refused: {error}"[:300]
                return "refused"
            log.warning("restart of %s through the driver failed: %s", action.job.ref, error)
            # No driver support: the job's own launcher restarts it; the record stands.
            result_handle, done_at = "", now
    placement.allocations_move(moves)
    action.state = ActionState.RUNNING
    action.handle, action.done_at, action.started_at, action.error = result_handle, done_at, now, ""
    action.deadline_at = now + deadline_after((done_at - now).total_seconds())
    if action.kind == ActionKind.RANK_REPLACEMENT:
        # It ends with the runtime's report of the standby in place, or falls back at this deadline.
        action.deadline_at = now + timedelta(seconds=settings.RANK_REPLACEMENT_DEADLINE_SECONDS)
    if action.kind in BUDGETED_KINDS:
        budget.cluster_running += 1
        budget.leaf_running[leaf] = budget.leaf_running.get(leaf, 0) + 1
    return "started"


# A whole-job restart that found no healthy spare says so in its error, which marks it as waiting for one.
SPARE_WAIT = "waiting for a healthy spare"
WAITING_FIELDS = ["error", "retry_at", "deadline_at"]


def waits_for_spare(action: RecoveryAction) -> bool:
    """Whether this planned whole-job action is waiting for a healthy spare (``_wait_for_spare``)."""
    return action.state == ActionState.PLANNED and action.error.startswith(SPARE_WAIT)


def _returned_since(action: RecoveryAction) -> bool:
    """Whether the dead node of a restart that waited for a spare was repaired and returned to service since its
    fault (its ladder's last step), so that the restart may take it back."""
    return (
        waits_for_spare(action)
        and NodeEscalation.objects.filter(
            node_id=action.node_id, stage=EscalationStage.RETURNED, updated_at__gte=action.detected_at
        ).exists()
    )


def _wait_for_spare(action: RecoveryAction, problem: str) -> str:
    """A whole-job restart with no healthy spare for a dead node's workers waits for one, up to
    RECOVERY_SPARE_WAIT_SECONDS from the fault (the recovery's ``detected_at``): it looks again every
    RECOVERY_SPARE_POLL_SECONDS, and at once when a node returns to service (``spares_returned``). Meanwhile its
    dead nodes go through their ladder to a repair (``escalation.Presence`` does not wait for a job parked so), and
    one repaired comes back to the job. Past the wait it is refused, and the recovery falls back as any refused
    restart does (its retries, then the job Failed). Returns ``"waiting"`` or ``"refused"``."""
    now = timezone.now()
    until = (action.detected_at or now) + timedelta(seconds=settings.RECOVERY_SPARE_WAIT_SECONDS)
    if now >= until:
        action.error = problem[:300]
        return "refused"
    action.error = f"{SPARE_WAIT} (until {until:%Y-%m-%d %H:%M} UTC): {problem}"[:300]
    action.retry_at = min(until, now + timedelta(seconds=settings.RECOVERY_SPARE_POLL_SECONDS))
    action.deadline_at = until
    return "waiting"


def waiting_for_spares():
    """The whole-job restarts waiting for a healthy spare (``_wait_for_spare``), as a queryset."""
    return RecoveryAction.objects.filter(
        state=ActionState.PLANNED, dry_run=False, kind__in=WHOLE_JOB_KINDS, error__startswith=SPARE_WAIT
    )


def spares_returned(cluster_id: int) -> int:
    """Nodes of the cluster came back into service: the restarts waiting for a spare there look again at once
    (beat's next step). Returns how many were woken."""
    now = timezone.now()
    return waiting_for_spares().filter(cluster_id=cluster_id, retry_at__gt=now).update(retry_at=now)


def _driver_start(action: RecoveryAction, cluster: Cluster, call, moves: list):
    """Make the driver call that starts ``action`` (``call``, its entry in ``CALLS``), telling a scheduler that
    places a whole-job restart itself where Lockstep placed it (``moves``). Returns the driver's operation; driver
    errors propagate to ``start_through_driver``."""
    # A scheduler that places the job itself (Slurm) is told which hosts a whole-job restart leaves, and
    # where Lockstep placed it instead.
    exclude = {allocation.node.hostname for allocation, _ in moves}
    if action.impact == "node" and action.node_id and action.kind in WHOLE_JOB_KINDS:
        # The node is gone even when Lockstep may not take it out of service yet (a fleet-wide cap).
        exclude.add(action.node.hostname)
    exclude = sorted(exclude)
    nodes = (
        [h for h in _placed_hosts(action, moves) if h not in exclude]
        if action.kind in WHOLE_JOB_KINDS
        else []
    )
    if action.kind == ActionKind.RESTART_FROM_CHECKPOINT:
        return driver_for(cluster).restart_from_checkpoint(action.job.ref, exclude=exclude, nodes=nodes)
    if action.kind == ActionKind.PROACTIVE_MIGRATION and _asks_write_through(cluster):
        from jobs.services.moves import move_ask

        return move_ask(action)  # written through first, then relaunched (jobs.services.moves)
    if action.kind == ActionKind.RESTORE_FROM_SNAPSHOT:
        return driver_for(cluster).restore_from_snapshot(
            action.job.ref,
            action.snapshot.handle if action.snapshot else "",
            exclude=exclude,
            nodes=nodes,
        )
    return call(driver_for(cluster), action)


def _placed_hosts(action: RecoveryAction, moves: list) -> list[str]:
    """The hosts a whole-job restart runs on: the job's nodes, each one it leaves replaced by its spare. A host
    the caller then excludes without a spare for it is left to the scheduler to fill (Slurm: ``ReqNodeList`` names
    the nodes the job must have, and it adds others up to its node count)."""
    moved = {allocation.pk: spare.hostname for allocation, spare in moves}
    held = JobAllocation.objects.filter(job_id=action.job_id, released_at__isnull=True).order_by("rank_start")
    return list(dict.fromkeys(moved.get(pk, host) for pk, host in held.values_list("pk", "node__hostname")))


def _asks_write_through(cluster) -> bool:
    from jobs.services.moves import asks_write_through

    return asks_write_through(cluster)


STARTED_FIELDS = ["state", "handle", "done_at", "started_at", "error", "deadline_at"]


def after_start(action: RecoveryAction) -> None:
    """What starting an action changes beyond the action: a proactive migration stops its running job."""
    job = action.job
    if action.kind == ActionKind.PROACTIVE_MIGRATION and job.state == JobState.RUNNING:
        now = action.started_at
        job.iteration, job.iteration_at, job.state = job.iteration_now(now), now, JobState.RECOVERING
        job.save(update_fields=["iteration", "iteration_at", "state"])
        phase_start(job, JobPhaseKind.RECOVERING, reason="proactive migration", at=now)
        record_progress(job, at=now, iteration=job.iteration)


def fail_action(action: RecoveryAction, error: str) -> None:
    """The action failed: release its spare, say why (``fail_many`` for one)."""
    fail_many([action], {action.pk: error})


def fail_many(actions: list[RecoveryAction], errors: dict[int, str], *, baseline_moves: bool = False) -> None:
    """These actions failed (refused, reported failed, timed out, or superseded): each ends ``failed`` with its
    error, saves nothing, and gives its spare back to the pool. With ``baseline_moves`` the next attempt of the
    same recovery takes over its baseline, so the ledger books one baseline per job recovery (docs/gpu-hours.md)."""
    if not actions:
        return
    now = timezone.now()
    for action in actions:
        action.state, action.error, action.ended_at = ActionState.FAILED, errors[action.pk][:300], now
        action.gpu_hours_saved = 0.0
        if baseline_moves:
            # Its time is inside the next attempt's pause (one clock per recovery): nothing of its own to book.
            action.moved_baseline = action.gpu_hours_baseline
            action.gpu_hours_baseline = action.gpu_hours_lost = action.pause_seconds = (
                action.work_lost_seconds
            ) = 0.0
    update_rows(
        actions,
        [
            "state",
            "error",
            "ended_at",
            "gpu_hours_saved",
            "gpu_hours_baseline",
            "gpu_hours_lost",
            "pause_seconds",
            "work_lost_seconds",
        ],
    )
    placement.release_many(actions)
    audit_record_many(
        [
            audit_entry(
                actor=None,
                action="recovery.fail",
                target=action,
                tenant_id=action.job.tenant_id if action.job_id else None,
                changes={"error": action.error},
            )
            for action in actions
        ]
    )
    for action in actions:
        publish_action(action, "action.failed")
