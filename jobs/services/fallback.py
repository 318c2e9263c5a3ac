"""Every recovery ends: a failed, refused or timed-out attempt is followed by the next-cheapest feasible one.

The next attempt is planned by the decision's own planner (``planning.plan_hit``) with the kinds that already
failed for this recovery left out: another spare (a live migration is tried on two spares at most), then a
snapshot restore, then a restart from checkpoint, which is always possible. A failed restart is retried after a
back-off, RECOVERY_RESTART_RETRIES times; then the job is Failed, with its reason, and a notification goes out.
Callers hold the cluster lock.
"""

from collections import Counter

from django.conf import settings

from jobs import placement
from jobs.choices import ACTIVE_ACTION_STATES, BUDGETED_KINDS, ActionKind, ActionState, JobPhaseKind, JobState
from jobs.models import Job, JobAllocation, RecoveryAction
from jobs.planner import Impact
from jobs.services.actions import after_start, fail_many, start_through_driver
from jobs.services.phases import phase_start, record_progress
from jobs.services.planning import (
    LINK_KINDS,
    Context,
    Hit,
    Retry,
    booking_of,
    healthy_nics_of,
    plan_hit,
    retry_backoff,
    snapshots_of,
)
from jobs.services.publishing import publish_action, publish_job

# How many spares a live or proactive migration is tried on before the recovery moves on to the next kind.
SPARES_TRIED = 2


def _attempts(action: RecoveryAction) -> list[RecoveryAction]:
    """This recovery's attempts so far, the newest first (a short chain: each failed attempt adds one)."""
    chain = [action]
    while chain[-1].previous_id and len(chain) < 50:
        chain.append(
            RecoveryAction.objects.only("pk", "kind", "to_node_id", "previous_id", "attempt").get(
                pk=chain[-1].previous_id
            )
        )
    return chain


def fail_and_fall_back(cluster, failures: list[tuple[RecoveryAction, str]]) -> list[RecoveryAction]:
    """Fail these attempts (with their errors) and plan the next attempt of each recovery they leave unfinished.
    Returns the new attempts."""
    failures = [(action, error) for action, error in failures if action.state in ACTIVE_ACTION_STATES]
    if not failures:
        return []
    with_next = [action for action, _ in failures if action.job_id and not action.dry_run]
    fail_many([a for a, _ in failures if a not in with_next], {a.pk: e for a, e in failures})
    fail_many(with_next, {a.pk: e for a, e in failures}, baseline_moves=True)
    if not with_next:
        return []
    # One context for the lot, read after they failed: the next attempts share its spare pool as a decision's
    # recoveries do (a spare handed to one is not handed to another), and the cluster is read once, not per job.
    ctx = Context.of(cluster, dry_run=False)
    return [
        nxt
        for nxt in (recovery_fall_back(action=action, cluster=cluster, ctx=ctx) for action in with_next)
        if nxt
    ]


def recovery_fall_back(
    *, action: RecoveryAction, cluster, ctx: Context | None = None
) -> RecoveryAction | None:
    """Plan (and start, back-off permitting) the attempt after ``action``, which has just failed, or end the
    recovery: the job Failed after its restarts, or running on when nothing is left to try. The failed attempt's
    baseline (set aside by ``fail_many(baseline_moves=True)``) goes to the next attempt, or back to it when there
    is none. ``ctx``: the context shared by the attempts that fail together (else one of its own)."""
    from jobs.services.jobs import job_fail

    job = (
        Job.objects.select_for_update(of=("self",), no_key=True)
        .select_related("tenant")
        .get(pk=action.job_id)
    )
    baseline = getattr(action, "moved_baseline", action.gpu_hours_baseline)
    if job.state not in (JobState.RUNNING, JobState.RECOVERING) or action.fault_id is None:
        _keep_baseline(action, baseline)
        return None
    chain = _attempts(action)
    tried = Counter(a.kind for a in chain)
    restarts = tried[ActionKind.RESTART_FROM_CHECKPOINT]
    if action.kind == ActionKind.RESTART_FROM_CHECKPOINT and restarts > settings.RECOVERY_RESTART_RETRIES:
        _keep_baseline(action, baseline)
        job_fail(job=job, reason=f"restart from checkpoint failed {restarts} times; last: {action.error}")
        return None
    excluded = {
        kind
        for kind, n in tried.items()
        if kind != ActionKind.RESTART_FROM_CHECKPOINT
        and not (kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION) and n < SPARES_TRIED)
    }
    retry_at = None
    if action.kind == ActionKind.RESTART_FROM_CHECKPOINT:
        excluded |= {k for k in ActionKind.values if k != ActionKind.RESTART_FROM_CHECKPOINT}
        retry_at = action.ended_at + retry_backoff(restarts)
    # the job's first allocation on the failed attempt's node, else its first (the others are not read)
    allocations = JobAllocation.objects.filter(job=job, released_at__isnull=True).select_related("node")
    first = allocations.filter(node_id=action.node_id).order_by("rank_start").first()
    allocation = first or allocations.order_by("rank_start").first()
    if allocation is None:
        _keep_baseline(action, baseline)
        return None
    impact = Impact(action.impact or Impact.RESTART)
    ctx = ctx or Context.of(cluster, dry_run=False)
    others = RecoveryAction.objects.filter(job=job, dry_run=False, state__in=ACTIVE_ACTION_STATES).exclude(
        pk=action.pk
    )
    retry = Retry(
        previous=action,
        baseline=baseline,
        excluded=frozenset(excluded),
        retry_at=retry_at,
        spare_exclude=frozenset(a.to_node_id for a in chain if a.to_node_id),
    )
    # A failed NIC failover beside the job's own recovery may only be followed by another failover.
    hit = Hit(
        job=job,
        fault=action.fault,
        impact=impact,
        allocation=allocation,
        retry=retry,
        link=action.kind in LINK_KINDS,
        only_link=action.kind in LINK_KINDS and others.exclude(kind__in=LINK_KINDS).exists(),
    )
    nxt, note = plan_hit(
        ctx,
        hit,
        snapshots=snapshots_of([job]).get(job.pk, []),
        healthy_nics=healthy_nics_of([allocation.node_id]).get(allocation.node_id, []),
    )
    if nxt is None:
        # Nothing left to do (a proactive move with no other spare: the job stays where it is, at risk).
        _keep_baseline(action, baseline)
        if job.state == JobState.RECOVERING and not others.exists():
            job.state, job.iteration_at = JobState.RUNNING, ctx.now
            job.save(update_fields=["state", "iteration_at"])
            phase_start(job, JobPhaseKind.RUNNING, reason=f"recovery ended: {note}", at=ctx.now)
            record_progress(job, at=ctx.now, iteration=job.iteration)
            publish_job(job, "job.state")
        return None
    if not (nxt.retry_at and nxt.retry_at > ctx.now):
        budget = placement.migration_budget(cluster) if nxt.kind in BUDGETED_KINDS else None
        if start_through_driver(nxt, cluster, budget) == "refused":
            nxt.save()
            after = fail_and_fall_back(cluster, [(nxt, nxt.error)])
            return after[0] if after else None
    nxt.save()
    booking = booking_of(nxt)
    if booking:
        placement.book_many([booking])
    if nxt.state == ActionState.RUNNING:
        after_start(nxt)  # a proactive move stops its job as it starts
    if job.state == JobState.RUNNING and nxt.kind != ActionKind.PROACTIVE_MIGRATION:
        job.iteration, job.iteration_at, job.state = job.iteration_now(ctx.now), ctx.now, JobState.RECOVERING
        job.save(update_fields=["iteration", "iteration_at", "state"])
        phase_start(job, JobPhaseKind.RECOVERING, reason=f"{action.kind} failed → {nxt.kind}", at=ctx.now)
    publish_action(nxt, "action.started" if nxt.state == ActionState.RUNNING else "action.planned")
    return nxt


def _keep_baseline(action: RecoveryAction, baseline: float) -> None:
    """The last attempt of a recovery that goes no further keeps the recovery's baseline (it saved nothing)."""
    if baseline and not action.gpu_hours_baseline:
        action.gpu_hours_baseline = baseline
        RecoveryAction.objects.filter(pk=action.pk).update(gpu_hours_baseline=baseline)
