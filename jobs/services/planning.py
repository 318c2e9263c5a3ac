"""Planning one job's recovery: what a decision knows of its cluster, the hit it answers, and the action chosen and
placed for it (the cheapest feasible option, its spare, GPU, NIC or restore point). Shared by the decision
(``jobs.services.recovery``) and by the next attempt after a failure (``jobs.services.fallback``).
"""

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from controlplane.prepared import PreparedQuery
from fleet.choices import LinkState
from fleet.models import NIC
from jobs import placement
from jobs.choices import BUDGETED_KINDS, ActionKind, SnapshotReason
from jobs.models import FaultEvent, Job, JobAllocation, JobSnapshot, RecoveryAction
from jobs.planner import (
    SPARE_KINDS,
    Estimates,
    Impact,
    JobFacts,
    Plan,
    Situation,
    gpu_hours_at_stake,
    plan,
    plan_with_spare_lookup,
)
from jobs.protection import job_protection
from jobs.services.actions import deadline_after
from jobs.services.capabilities import protection_of, supported_operations
from jobs.services.estimates import RestartBaseline, chosen_with, estimates_for, restart_baseline

# One NIC's recovery: the job keeps running on its other rails, so a failover is not the job's recovery and may run
# beside it (the one-recovery-per-job constraint leaves it out).
LINK_KINDS = frozenset({ActionKind.NIC_FAILOVER})
LINK_IMPACTS = (Impact.NIC, Impact.DEGRADED)
JOB_KINDS = frozenset(
    {
        ActionKind.INTRA_NODE_MIGRATION,
        ActionKind.LIVE_MIGRATION,
        ActionKind.PROACTIVE_MIGRATION,
        ActionKind.GPU_RESET,
        ActionKind.RESTORE_FROM_SNAPSHOT,
        ActionKind.RANK_REPLACEMENT,
        ActionKind.RESTART_FROM_CHECKPOINT,
    }
)


@dataclass
class Context:
    """What a decision knows of its cluster, read once: estimates, protection, the spare pool and budget."""

    cluster: object
    now: datetime
    dry_run: bool
    estimates: Estimates
    supports: frozenset[str]
    protected: bool
    overhead: float  # the cluster's setting: the restart overhead assumed until restarts are measured
    spares: placement.SparePool
    budget: placement.Budget | None = None  # read when a recovery first needs a spare node
    queued: int = 0  # budgeted moves this decision queued
    booked: set[int] = field(default_factory=set)
    verdict: object = None  # the cluster's protection verdict (simulated jobs)
    by_job: dict[int, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, cluster, *, dry_run: bool) -> "Context":
        verdict = protection_of(cluster, max_age=2.0)
        return cls(
            cluster=cluster,
            now=timezone.now(),
            dry_run=dry_run,
            estimates=estimates_for(cluster),
            supports=supported_operations(cluster),
            protected=verdict.protected,
            overhead=cluster.restart_overhead_minutes * 60.0,
            spares=placement.SparePool(cluster),
            verdict=verdict,
        )

    def restart_for(self, job: Job) -> RestartBaseline:
        """The restart overhead this job's baseline is priced with: measured on this cluster for jobs of its size,
        or the cluster's setting, assumed (jobs.services.estimates)."""
        return restart_baseline(self.estimates, gpus=job.gpus, assumed_seconds=self.overhead)

    def protected_for(self, job: Job, at: datetime) -> bool:
        """Whether this job is protected when its fault was detected: the cluster's verdict for a simulated job;
        for a real one its policy and its own runtime's reports (jobs.protection), read once a decision."""
        if job.simulated:
            return self.protected
        if job.pk not in self.by_job:
            self.by_job[job.pk] = job_protection(
                job, at=min(at, self.now), cluster_verdict=self.verdict
            ).protected
        return self.by_job[job.pk]

    def spare_for(self, node, gpus: int, exclude=frozenset()) -> tuple[object, float]:
        """The spare node for a worker leaving ``node``, and the wait for the budget to move it there."""
        if self.budget is None:
            self.budget = placement.migration_budget(self.cluster)
        wait = replace(self.budget, queued=self.budget.queued + self.queued).wait_seconds(
            self.estimates.migration_pause
        )
        return self.spares.pick(near=node, gpus=gpus, exclude=self.booked | set(exclude)), wait


# The decision's reads of snapshots and links, compiled once per process (controlplane/prepared.py).
_SNAPSHOTS = PreparedQuery(
    lambda jobs: JobSnapshot.objects.filter(job_id__in_array=jobs, state="succeeded"), jobs=list[int]
)
_HEALTHY_NICS = PreparedQuery(
    lambda nodes: (
        NIC.objects.filter(node_id__in_array=nodes, link_state=LinkState.UP)
        .order_by("rail")
        .values_list("node_id", "name")
    ),
    nodes=list[int],
)


def snapshots_of(jobs) -> dict[int, list[JobSnapshot]]:
    found: dict[int, list[JobSnapshot]] = {}
    with_snapshots = sorted(job.pk for job in jobs if getattr(job, "has_snapshots", True))
    for snapshot in _SNAPSHOTS.rows(jobs=with_snapshots) if with_snapshots else ():
        found.setdefault(snapshot.job_id, []).append(snapshot)
    return found


def healthy_nics_of(node_ids) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for node_id, name in _HEALTHY_NICS.rows(nodes=sorted(node_ids)) if node_ids else ():
        found.setdefault(node_id, []).append(name)
    return found


@dataclass
class Hit:
    """A job hit by faults, and what its recovery must answer. A job gets one job-level hit a decision (its
    most severe faults), and one link hit per NIC of a node that lost one, answered beside it."""

    job: Job
    fault: FaultEvent  # the most severe: the action is recorded against it
    impact: Impact
    allocation: JobAllocation  # the worker it hit
    link: bool = False
    nodes: set[int] = field(default_factory=set)  # the nodes whose workers its recovery stops
    only_link: bool = (
        False  # the job has a recovery of its own: answer this one with a failover, or not at all
    )
    retry: "Retry | None" = None
    booked_by: RecoveryAction | None = (
        None  # the incident's recovery of this job that already booked the baseline
    )
    stayed: "Plan | None" = None  # staying put was cheapest (a degraded link run degraded): the plan says why


@dataclass(frozen=True)
class Retry:
    """What a new attempt carries over from the one it replaces (failed, timed out or superseded)."""

    previous: RecoveryAction
    baseline: float  # the recovery's baseline, booked once
    excluded: frozenset[str] = frozenset()  # kinds that failed for this recovery
    spare_exclude: frozenset[int] = frozenset()  # spares already tried
    retry_at: datetime | None = None


def facts_of(
    job: Job,
    allocation: JobAllocation,
    impact: Impact,
    fault: FaultEvent,
    protected: bool,
    overhead: float,
    snapshots: list[JobSnapshot],
    now,
) -> tuple[JobFacts, JobSnapshot | None]:
    at = min(fault.detected_at, now)
    iteration = job.iteration_now(at)
    checkpoint = job.checkpoint_iteration_now(at)
    since_checkpoint = max(0, iteration - checkpoint) * job.seconds_per_iteration
    usable = [s for s in snapshots if checkpoint < s.iteration <= iteration]
    snapshot = max(usable, key=lambda s: s.iteration) if usable else None
    since_snapshot = (iteration - snapshot.iteration) * job.seconds_per_iteration if snapshot else None
    runtime = [s for s in snapshots if s.reason == SnapshotReason.RUNTIME and s.iteration <= iteration]
    if snapshot is None and runtime and protected and not job.simulated:
        # A protection runtime keeps a restore point at least as new as the last one it reported (its reports are
        # coalesced), and the job resumes from the newer of that and its checkpoint: a restore loses no more than
        # a restart even when the last report is not past the checkpoint.
        snapshot = max(runtime, key=lambda s: s.iteration)
        since_snapshot = min(since_checkpoint, (iteration - snapshot.iteration) * job.seconds_per_iteration)
    affected = 1 if impact == Impact.DEVICE else allocation.gpu_count
    return JobFacts(
        gpus=job.gpus,
        gpus_affected=affected,
        seconds_since_checkpoint=since_checkpoint,
        protected=protected,
        restart_overhead_seconds=overhead,
        seconds_since_snapshot=since_snapshot,
    ), snapshot


def plan_hit(
    ctx: Context,
    hit: Hit,
    *,
    snapshots: list[JobSnapshot],
    healthy_nics: list[str],
    spare_gpus: list[int] | None = None,
) -> tuple[RecoveryAction | None, str]:
    """Plan and place the one recovery for a hit (not yet written): the cheapest feasible option, its spare, GPU,
    NIC or restore point. With ``hit.retry`` it is the next attempt of a recovery: the kinds that failed are out,
    and it keeps the recovery's clock and baseline; with ``hit.booked_by`` another action of the incident booked
    the baseline for this job, so this one books none. Returns the action (None when nothing needs doing) and a
    note. ``spare_gpus``: the node's spare GPUs, when the caller read them for many hits at once."""
    job, fault, allocation, retry = hit.job, hit.fault, hit.allocation, hit.retry
    node, now = allocation.node, ctx.now
    baseline = ctx.restart_for(job)
    facts, snapshot = facts_of(
        job,
        allocation,
        hit.impact,
        fault,
        ctx.protected_for(job, fault.detected_at),
        baseline.seconds,
        snapshots,
        now,
    )
    stake = gpu_hours_at_stake(facts)
    if hit.impact != Impact.DEVICE or not facts.protected:
        spare_gpus = []
    elif spare_gpus is None:
        spare_gpus = placement.spare_gpus_on_node(node)
    spare_nic = next((n for n in healthy_nics if n != fault.nic_name), None)
    situation = Situation(
        impact=hit.impact,
        healthy_nic=spare_nic is not None,
        spare_gpus_on_node=len(spare_gpus),
        gpu_reset=(fault.triage or {}).get("remediation") == "gpu_reset",
        risk=max(node.risk_score, 0.5),
        supports=ctx.supports,
        excluded=(retry.excluded if retry else frozenset()) | (JOB_KINDS if hit.only_link else frozenset()),
        standbys=_standbys(job, node)
        if hit.impact == Impact.NODE and facts.protected and ActionKind.RANK_REPLACEMENT in ctx.supports
        else 0,
    )
    found = []

    def look_up() -> tuple[bool, float]:
        spare, wait = ctx.spare_for(
            node, allocation.gpu_count, exclude=retry.spare_exclude if retry else frozenset()
        )
        found.append(spare)
        return spare is not None and wait != math.inf, min(wait, 1e9)

    if hit.impact in (Impact.DEVICE, Impact.NODE, Impact.NIC, Impact.RISK) and facts.protected:
        # The spare pool is read only when a spare could beat the recoveries that need none.
        decision, _ = plan_with_spare_lookup(facts, situation, ctx.estimates, look_up)
    else:
        decision = plan(facts, situation, ctx.estimates)
    if decision.chosen is None:
        if decision.stay is not None and not ctx.dry_run:
            hit.stayed = decision
        if decision.stay is not None:
            return None, f"job {job.pk}: {decision.reason}" + (" (dry run)" if ctx.dry_run else "")
        why = decision.options[0].why if decision.options else "no action needed"
        return None, f"job {job.pk}: {why}"
    chosen = decision.chosen
    action = RecoveryAction(
        fault=fault,
        incident_id=fault.incident_id,
        job=job,
        cluster=ctx.cluster,
        kind=chosen.kind,
        impact=hit.impact,
        dry_run=ctx.dry_run,
        node=node,
        detected_at=fault.detected_at,
        planned_at=now,
        gpus=job.gpus,
        pause_seconds=chosen.pause_seconds,
        work_lost_seconds=chosen.work_lost_seconds,
        degraded_seconds=chosen.degraded_seconds,
        slowdown=chosen.slowdown,
        gpu_hours_lost=chosen.gpu_hours_lost,
        gpu_hours_baseline=decision.baseline,
        gpu_hours_saved=decision.baseline - chosen.gpu_hours_lost,
        gpu_hours_at_stake=stake,
        reason=decision.reason,
        alternatives=[o.as_dict() for o in decision.options],
        gpu_index=fault.gpu_index,
        nic_name=fault.nic_name,
        deadline_at=now + deadline_after(chosen.pause_seconds),
        risk_score=situation.risk,
        estimate={
            **chosen_with(ctx.estimates, chosen.kind, hit.impact),
            # The baseline's restart overhead (measured or assumed), and what this action was expected to cost:
            # the ledger fields are overwritten with what happened, this stays what was expected.
            "restart_overhead": baseline.as_dict(),
            "expected": {
                "pause_seconds": round(chosen.pause_seconds, 3),
                "work_lost_seconds": round(chosen.work_lost_seconds, 3),
                "gpu_hours_lost": round(chosen.gpu_hours_lost, 4),
                "gpu_hours_baseline": round(decision.baseline, 4),
            },
        },
    )
    if retry is not None:
        # One recovery, one clock and one baseline: the attempt it replaces booked them.
        previous = retry.previous
        action.previous, action.attempt, action.detected_at = (
            previous,
            previous.attempt + 1,
            previous.detected_at,
        )
        action.gpu_hours_baseline = retry.baseline
        action.gpu_hours_saved = action.gpu_hours_baseline - action.gpu_hours_lost
        action.retry_at = retry.retry_at
        if retry.retry_at:
            action.deadline_at = retry.retry_at + deadline_after(chosen.pause_seconds)
        action.reason = (
            f"attempt {action.attempt}, after {previous.kind} (action {previous.pk}) ended: {action.reason}"
        )
    if hit.booked_by is not None:
        action.gpu_hours_baseline, action.gpu_hours_saved = 0.0, -action.gpu_hours_lost
        action.reason = (
            f"incident {fault.incident_id} again: action {hit.booked_by.pk} booked its baseline for this "
            f"job. {action.reason}"
        )
    _place(
        ctx,
        action,
        chosen.kind,
        spare=found[0] if found else None,
        spare_gpus=spare_gpus,
        spare_nic=spare_nic,
        snapshot=snapshot,
    )
    return action, f"job {job.pk}: {chosen.kind}" + (" (dry run)" if ctx.dry_run else "")


def _standbys(job: Job, lost) -> int:
    """The job's live standbys off the lost node (a real job's runtime reports them; a simulated job has none)."""
    if job.simulated:
        return 0
    from jobs.services.in_job import live_standbys

    return sum(1 for standby in live_standbys(job) if standby.node_id != lost.pk)


def _place(
    ctx: Context, action: RecoveryAction, kind: str, *, spare, spare_gpus, spare_nic, snapshot
) -> None:
    """Where the chosen recovery goes: the spare node, the spare GPU, the healthy NIC or the restore point."""
    if kind in SPARE_KINDS:
        action.to_node = spare
        ctx.booked.add(spare.pk)
    if kind in BUDGETED_KINDS:
        ctx.queued += 1
    if kind == ActionKind.INTRA_NODE_MIGRATION:
        action.to_node, action.to_gpu_index = action.node, spare_gpus[0]
    if kind == ActionKind.NIC_FAILOVER:
        action.to_nic_name = spare_nic
    if kind == ActionKind.RESTORE_FROM_SNAPSHOT:
        # The newer of the restore point and the checkpoint (the job resumes from whichever is newer).
        checkpoint = action.job.checkpoint_iteration_now(min(action.fault.detected_at, ctx.now))
        action.snapshot, action.restore_iteration = snapshot, max(snapshot.iteration, checkpoint)
    if kind in (ActionKind.RESTART_FROM_CHECKPOINT, ActionKind.GPU_RESET):
        at = min(action.fault.detected_at, ctx.now)
        action.restore_iteration = action.job.checkpoint_iteration_now(at)
        if kind == ActionKind.GPU_RESET and snapshot is not None:
            action.snapshot, action.restore_iteration = snapshot, snapshot.iteration


def booking_of(action: RecoveryAction) -> tuple[RecoveryAction, object, int | None] | None:
    """The spare an action books (a whole node, or one GPU for an intra-node move); dry runs book nothing."""
    if action.dry_run or not action.to_node_id:
        return None
    if action.kind == ActionKind.INTRA_NODE_MIGRATION:
        return action, action.node, action.to_gpu_index
    return action, action.to_node, None


def retry_backoff(attempt: int) -> timedelta:
    """How long the n-th retry of a failed restart waits (doubling from RECOVERY_RETRY_BACKOFF_SECONDS)."""
    return timedelta(seconds=settings.RECOVERY_RETRY_BACKOFF_SECONDS * 2 ** max(0, attempt - 1))
