"""The decision for a batch of new faults of one cluster, in named stages:

    gather → triage → plan → place → act → record

Called by ``fault_handle`` with the cluster row locked, so it is the one placement decision of the cluster at
this moment. Everything happens in the caller's transaction: if the worker dies mid-way nothing is kept, the
faults stay new, and the sweep hands them out again.

One incident, one recovery (docs/incidents.md): the faults of a decision that hit one job are answered by one
action (the most severe decides; workers hit on several nodes restart the whole job), and a fault on a job whose
recovery is already under way folds into it, or replaces it when that recovery no longer answers it.
"""

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from fleet.choices import GPUHealth, LinkState
from fleet.models import NIC
from fleet.services import hardware
from jobs import placement
from jobs.choices import BUDGETED_KINDS, ActionKind, ActionState, FaultState, JobPhaseKind, JobState
from jobs.models import FaultEvent, Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, RecoveryAction
from jobs.planner import (
    SPARE_KINDS,
    WHOLE_JOB_KINDS,
    Estimates,
    Impact,
    JobFacts,
    Situation,
    fair_order,
    gpu_hours_at_stake,
    plan,
    plan_with_spare_lookup,
)
from jobs.services import escalation
from jobs.services.actions import ACTIVE_STATES, after_start, deadline_after, start_through_driver
from jobs.services.common import (
    cluster_topics,
    decision_lists,
    estimates_for,
    fault_payload,
    phase_family,
    phases_switch,
    protection_of,
    supported_operations,
)
from jobs.triage import FaultVerdict

STOPS_JOB = {ActionKind.INTRA_NODE_MIGRATION, ActionKind.LIVE_MIGRATION, ActionKind.GPU_RESET,
             ActionKind.RESTORE_FROM_SNAPSHOT, ActionKind.RESTART_FROM_CHECKPOINT, ActionKind.NIC_FAILOVER}


# --- gather ------------------------------------------------------------------------------------------------

@dataclass
class Context:
    """What a decision knows of its cluster, read once: estimates, protection, the spare pool and budget."""

    cluster: object
    now: datetime
    dry_run: bool
    estimates: Estimates
    supports: frozenset[str]
    protected: bool
    overhead: float
    spares: placement.SparePool
    budget: placement.Budget | None = None   # read when a recovery first needs a spare node
    queued: int = 0                          # budgeted moves this decision queued
    booked: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, cluster, *, dry_run: bool) -> "Context":
        return cls(cluster=cluster, now=timezone.now(), dry_run=dry_run, estimates=estimates_for(cluster),
                   supports=supported_operations(cluster), protected=protection_of(cluster, max_age=2.0).protected,
                   overhead=cluster.restart_overhead_minutes * 60.0, spares=placement.SparePool(cluster))

    def spare_for(self, node, gpus: int, exclude=frozenset()) -> tuple[object, float]:
        """The spare node for a worker leaving ``node``, and the wait for the budget to move it there."""
        if self.budget is None:
            self.budget = placement.migration_budget(self.cluster)
        wait = replace(self.budget, queued=self.budget.queued + self.queued).wait_seconds(self.estimates.migration_pause)
        return self.spares.pick(near=node, gpus=gpus, exclude=self.booked | set(exclude)), wait


def _active_allocations():
    return (JobAllocation.objects.filter(released_at__isnull=True, job__state__in=(JobState.RUNNING, JobState.RECOVERING))
            .select_related("node"))


def _jobs_locked(job_ids, incident_ids) -> dict[int, Job]:
    """The jobs, row-locked, knowing whether they have snapshots, a recovery under way (job-level, or a NIC
    failover), and an action of one of these incidents that finished (and so booked the incident's baseline)."""
    under_way = RecoveryAction.objects.filter(job=OuterRef("pk"), dry_run=False, state__in=ACTIVE_STATES)
    recovered = RecoveryAction.objects.filter(job=OuterRef("pk"), dry_run=False, state=ActionState.SUCCEEDED,
                                              incident_id__in=incident_ids)
    return {job.pk: job for job in Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant")
            .annotate(has_snapshots=Exists(JobSnapshot.objects.filter(job=OuterRef("pk"), state="succeeded")),
                      recovering_now=Exists(under_way), recovered_from_incident=Exists(recovered))
            .filter(pk__in=set(job_ids)).order_by("pk")}


def _under_way(jobs: dict[int, Job]) -> tuple[dict[int, RecoveryAction], set[tuple[int, int, str]]]:
    """The jobs' recoveries under way, row-locked: the job-level one by job, and their NIC failovers as (job, node,
    NIC)."""
    ids = [pk for pk, job in jobs.items() if job.recovering_now]
    active, failovers = {}, set()
    for action in (RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
                   .filter(job_id__in=ids, dry_run=False, state__in=ACTIVE_STATES) if ids else ()):
        if action.kind in LINK_KINDS:
            failovers.add((action.job_id, action.node_id, action.nic_name))
        else:
            active[action.job_id] = action
    return active, failovers


def _booked(hits: list["Hit"]) -> dict[tuple[int, int], RecoveryAction]:
    """For hits on jobs whose incident already has a finished recovery of theirs (a move within the node, then the
    node died): that action, which booked the incident's baseline for the job, by (job, incident)."""
    jobs = [h.job.pk for h in hits if h.job.recovered_from_incident]
    if not jobs:
        return {}
    rows = (RecoveryAction.objects.filter(job_id__in=jobs, incident_id__in={h.fault.incident_id for h in hits},
                                          dry_run=False, state=ActionState.SUCCEEDED, gpu_hours_baseline__gt=0)
            .order_by("pk"))
    return {(action.job_id, action.incident_id): action for action in rows}


def snapshots_of(jobs) -> dict[int, list[JobSnapshot]]:
    found: dict[int, list[JobSnapshot]] = {}
    with_snapshots = [job.pk for job in jobs if getattr(job, "has_snapshots", True)]
    for snapshot in JobSnapshot.objects.filter(job_id__in=with_snapshots, state="succeeded") if with_snapshots else ():
        found.setdefault(snapshot.job_id, []).append(snapshot)
    return found


def healthy_nics_of(node_ids) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for node_id, name in (NIC.objects.filter(node_id__in=set(node_ids), link_state=LinkState.UP).order_by("rail")
                          .values_list("node_id", "name")) if node_ids else ():
        found.setdefault(node_id, []).append(name)
    return found


# --- triage ------------------------------------------------------------------------------------------------

# One NIC's recovery: the job keeps running on its other rails, so a failover is not the job's recovery and may run
# beside it (the one-recovery-per-job constraint leaves it out).
LINK_KINDS = frozenset({ActionKind.NIC_FAILOVER})
LINK_IMPACTS = (Impact.NIC, Impact.DEGRADED)
JOB_KINDS = frozenset({ActionKind.INTRA_NODE_MIGRATION, ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION,
                       ActionKind.GPU_RESET, ActionKind.RESTORE_FROM_SNAPSHOT, ActionKind.RESTART_FROM_CHECKPOINT})


@dataclass
class Hit:
    """A job hit by faults, and what its recovery must answer. A job gets one job-level hit a decision (its
    most severe faults), and one link hit per NIC of a node that lost one, answered beside it."""

    job: Job
    fault: FaultEvent            # the most severe: the action is recorded against it
    impact: Impact
    allocation: JobAllocation    # the worker it hit
    faults: list[FaultEvent] = field(default_factory=list)
    link: bool = False
    nodes: set[int] = field(default_factory=set)        # the nodes whose workers its recovery stops
    only_link: bool = False      # the job has a recovery of its own: answer this one with a failover, or not at all
    retry: "Retry | None" = None
    booked_by: RecoveryAction | None = None   # the incident's recovery of this job that already booked the baseline


def _affected(fault: FaultEvent, impact: str, on_nodes: dict[int, list[JobAllocation]]) -> list[JobAllocation]:
    """The allocations a fault hits: on its node (``on_nodes``, fetched once per batch), or its whole rack."""
    if fault.kind == "facility" and fault.rack:
        found = list(_active_allocations().filter(node__cluster_id=fault.cluster_id, node__rack=fault.rack))
    else:
        found = on_nodes.get(fault.node_id, [])
    if impact == Impact.DEVICE and fault.gpu_index is not None:
        found = [a for a in found if fault.gpu_index in a.gpu_indices]
    return found


def _mark_hardware(marks: list[tuple[FaultEvent, FaultVerdict]]) -> None:
    """Record on the fleet's rows what the faults took out: the GPUs, or the NICs' links."""
    gpus = [(fault.node_id, fault.gpu_index, GPUHealth.FAILED, verdict.explanation) for fault, verdict in marks
            if verdict.out_of_service and fault.gpu_index is not None]
    links: dict[str, list[tuple[int, str]]] = {}
    for fault, verdict in marks:
        if fault.nic_name and verdict.job_impact in (Impact.NIC, Impact.DEGRADED):
            state = LinkState.DOWN if verdict.job_impact == Impact.NIC else LinkState.DEGRADED
            links.setdefault(state, []).append((fault.node_id, fault.nic_name))
    if gpus:
        hardware.gpus_mark(marks=gpus)
    for state, which in sorted(links.items()):
        hardware.nic_links_set(links=which, state=state)


def group_hits(pairs: list[tuple[FaultEvent, Impact, JobAllocation]], jobs: dict[int, Job],
               outcome: dict[int, list[str]]) -> list[Hit]:
    """The hits of a decision from its (fault, impact, allocation) pairs. Per job: one job-level hit, decided by
    the most severe pair (workers stopped on two or more nodes make it a whole-job restart); and one link hit per
    NIC down or degraded on a node whose worker that recovery does not stop. Faults that decide nothing are noted
    as folded into the one that does."""
    by_job: dict[int, list[tuple[FaultEvent, Impact, JobAllocation]]] = {}
    for pair in pairs:
        by_job.setdefault(pair[2].job_id, []).append(pair)
    hits = []
    for job_id, mine in by_job.items():
        mine.sort(key=lambda p: (p[1].rank, p[0].received_at, p[0].pk))
        job_level = [p for p in mine if p[1] not in LINK_IMPACTS]
        main = None
        if job_level:
            fault, impact, allocation = job_level[0]
            stopped = {p[2].node_id for p in job_level if p[1].stops_job}
            if len(stopped) > 1:
                impact = Impact.RESTART
            faults = list({p[0].pk: p[0] for p in job_level}.values())
            main = Hit(job=jobs[job_id], fault=fault, impact=impact, allocation=allocation, faults=faults,
                       nodes=stopped or {allocation.node_id})
            hits.append(main)
            _fold(outcome, [f for f in faults if f.pk != fault.pk], job_id, fault)
        links: dict[tuple[int, str], Hit] = {}
        for fault, impact, allocation in (p for p in mine if p[1] in LINK_IMPACTS):
            if main is not None and main.impact.stops_job and allocation.node_id in main.nodes:
                _fold(outcome, [fault], job_id, main.fault)       # its worker leaves that node anyway
            elif (allocation.node_id, fault.nic_name) in links:
                _fold(outcome, [fault], job_id, links[allocation.node_id, fault.nic_name].fault)
            else:
                links[allocation.node_id, fault.nic_name] = Hit(
                    job=jobs[job_id], fault=fault, impact=impact, allocation=allocation, faults=[fault], link=True,
                    nodes={allocation.node_id}, only_link=main is not None)
        hits.extend(links.values())
    return hits


def _fold(outcome: dict[int, list[str]], faults: list[FaultEvent], job_id: int, into: FaultEvent) -> None:
    for fault in faults:
        outcome[fault.pk].append(f"job {job_id}: folded into its recovery for fault {into.pk}")


def covers(active: RecoveryAction, hit: Hit) -> bool:
    """Whether a job's recovery under way already answers a new hit: a whole-job restart answers anything; a move
    off a node answers anything on that node; otherwise only a hit no more severe than the one it answers. A fault
    that does not stop the job never interrupts a recovery."""
    if not hit.impact.stops_job or active.kind in WHOLE_JOB_KINDS:
        return True
    if hit.allocation.node_id != active.node_id:
        return False
    if active.kind == ActionKind.LIVE_MIGRATION or (active.kind == ActionKind.PROACTIVE_MIGRATION
                                                    and active.state == ActionState.RUNNING):
        return True
    return Impact(active.impact or Impact.NONE).rank <= hit.impact.rank


def against_under_way(hits: list[Hit], active: dict[int, RecoveryAction], failovers: set[tuple[int, int, str]],
                      outcome: dict[int, list[str]]) -> tuple[list[Hit], dict[int, str]]:
    """Weigh each hit against the job's recoveries under way (``active``: its job-level one; ``failovers``: (job,
    node, NIC) of its NIC failovers): it folds into one that answers it, or, for a job-level hit, replaces the
    job's recovery (returned: the actions superseded, with why). Returns the hits still to plan."""
    replaced: dict[int, str] = {}
    left = []
    for hit in hits:
        running = active.get(hit.job.pk)
        if hit.link and (hit.job.pk, hit.allocation.node_id, hit.fault.nic_name) in failovers:
            outcome[hit.fault.pk].append(f"job {hit.job.pk}: its failover of {hit.fault.nic_name} is under way")
            continue
        if running is not None and (covers(running, hit) if not hit.link else
                                    running.kind in WHOLE_JOB_KINDS or (running.node_id == hit.allocation.node_id
                                                                        and running.kind in SPARE_KINDS)):
            outcome[hit.fault.pk].append(f"job {hit.job.pk}: folded into its {running.kind} (action {running.pk})")
            continue
        if running is not None and hit.link:
            hit.only_link = True
        elif running is not None:
            if hit.allocation.node_id != running.node_id:
                hit.impact = Impact.RESTART     # workers on two nodes are hit now: the whole job restarts
            hit.retry = Retry(previous=running, baseline=running.gpu_hours_baseline)
            replaced[running.pk] = f"superseded by fault {hit.fault.pk} ({hit.fault.kind} on {hit.fault.node.hostname})"
        left.append(hit)
    return left, replaced


# --- plan and place ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Retry:
    """What a new attempt carries over from the one it replaces (failed, timed out or superseded)."""

    previous: RecoveryAction
    baseline: float                             # the recovery's baseline, booked once
    excluded: frozenset[str] = frozenset()     # kinds that failed for this recovery
    spare_exclude: frozenset[int] = frozenset()  # spares already tried
    retry_at: datetime | None = None


def _facts(job: Job, allocation: JobAllocation, impact: Impact, fault: FaultEvent, protected: bool,
           overhead: float, snapshots: list[JobSnapshot], now) -> tuple[JobFacts, JobSnapshot | None]:
    at = min(fault.detected_at, now)
    iteration = job.iteration_now(at)
    checkpoint = job.checkpoint_iteration_now(at)
    since_checkpoint = max(0, iteration - checkpoint) * job.seconds_per_iteration
    usable = [s for s in snapshots if checkpoint < s.iteration <= iteration]
    snapshot = max(usable, key=lambda s: s.iteration) if usable else None
    since_snapshot = (iteration - snapshot.iteration) * job.seconds_per_iteration if snapshot else None
    affected = 1 if impact == Impact.DEVICE else allocation.gpu_count
    return JobFacts(gpus=job.gpus, gpus_affected=affected, seconds_since_checkpoint=since_checkpoint,
                    protected=protected, restart_overhead_seconds=overhead, seconds_since_snapshot=since_snapshot), snapshot


def plan_hit(ctx: Context, hit: Hit, *, snapshots: list[JobSnapshot],
             healthy_nics: list[str]) -> tuple[RecoveryAction | None, str]:
    """Plan and place the one recovery for a hit (not yet written): the cheapest feasible option, its spare, GPU,
    NIC or restore point. With ``hit.retry`` it is the next attempt of a recovery: the kinds that failed are out,
    and it keeps the recovery's clock and baseline; with ``hit.booked_by`` another action of the incident booked
    the baseline for this job, so this one books none. Returns the action (None when nothing needs doing) and a
    note."""
    job, fault, allocation, retry = hit.job, hit.fault, hit.allocation, hit.retry
    node, now = allocation.node, ctx.now
    facts, snapshot = _facts(job, allocation, hit.impact, fault, ctx.protected, ctx.overhead, snapshots, now)
    stake = gpu_hours_at_stake(facts)
    spare_gpus = placement.spare_gpus_on_node(node) if hit.impact == Impact.DEVICE and facts.protected else []
    spare_nic = next((n for n in healthy_nics if n != fault.nic_name), None)
    situation = Situation(impact=hit.impact, healthy_nic=spare_nic is not None, spare_gpus_on_node=len(spare_gpus),
                          gpu_reset=(fault.triage or {}).get("remediation") == "gpu_reset",
                          risk=max(node.risk_score, 0.5), supports=ctx.supports,
                          excluded=(retry.excluded if retry else frozenset()) | (JOB_KINDS if hit.only_link else frozenset()))
    found = []

    def look_up() -> tuple[bool, float]:
        spare, wait = ctx.spare_for(node, allocation.gpu_count, exclude=retry.spare_exclude if retry else frozenset())
        found.append(spare)
        return spare is not None and wait != math.inf, min(wait, 1e9)

    if hit.impact in (Impact.DEVICE, Impact.NODE, Impact.NIC, Impact.RISK) and facts.protected:
        # The spare pool is read only when a spare could beat the recoveries that need none.
        decision, _ = plan_with_spare_lookup(facts, situation, ctx.estimates, look_up)
    else:
        decision = plan(facts, situation, ctx.estimates)
    if decision.chosen is None:
        why = decision.options[0].why if decision.options else "no action needed"
        return None, f"job {job.pk}: {why}"
    chosen = decision.chosen
    action = RecoveryAction(
        fault=fault, incident_id=fault.incident_id, job=job, cluster=ctx.cluster, kind=chosen.kind, impact=hit.impact,
        dry_run=ctx.dry_run, node=node, detected_at=fault.detected_at, planned_at=now, gpus=job.gpus,
        pause_seconds=chosen.pause_seconds, work_lost_seconds=chosen.work_lost_seconds,
        degraded_seconds=chosen.degraded_seconds, slowdown=chosen.slowdown, gpu_hours_lost=chosen.gpu_hours_lost,
        gpu_hours_baseline=decision.baseline, gpu_hours_saved=decision.baseline - chosen.gpu_hours_lost,
        gpu_hours_at_stake=stake, reason=decision.reason, alternatives=[o.as_dict() for o in decision.options],
        gpu_index=fault.gpu_index, nic_name=fault.nic_name,
        deadline_at=now + deadline_after(chosen.pause_seconds), risk_score=situation.risk)
    if retry is not None:
        # One recovery, one clock and one baseline: the attempt it replaces booked them.
        previous = retry.previous
        action.previous, action.attempt, action.detected_at = previous, previous.attempt + 1, previous.detected_at
        action.gpu_hours_baseline = retry.baseline
        action.gpu_hours_saved = action.gpu_hours_baseline - action.gpu_hours_lost
        action.retry_at = retry.retry_at
        if retry.retry_at:
            action.deadline_at = retry.retry_at + deadline_after(chosen.pause_seconds)
        action.reason = f"attempt {action.attempt}, after {previous.kind} (action {previous.pk}) ended: {action.reason}"
    if hit.booked_by is not None:
        action.gpu_hours_baseline, action.gpu_hours_saved = 0.0, -action.gpu_hours_lost
        action.reason = (f"incident {fault.incident_id} again: action {hit.booked_by.pk} booked its baseline for this "
                         f"job. {action.reason}")
    _place(ctx, action, chosen.kind, spare=found[0] if found else None, spare_gpus=spare_gpus, spare_nic=spare_nic,
           snapshot=snapshot)
    return action, f"job {job.pk}: {chosen.kind}" + (" (dry run)" if ctx.dry_run else "")


def _place(ctx: Context, action: RecoveryAction, kind: str, *, spare, spare_gpus, spare_nic, snapshot) -> None:
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
        action.snapshot, action.restore_iteration = snapshot, snapshot.iteration
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


def supersede(active: list[RecoveryAction], reasons: dict[int, str]) -> None:
    """End recoveries that a new fault replaces: failed, "superseded by …", their spares back in the pool, their
    baseline passed on to the attempt that replaces them (booked once per recovery)."""
    from jobs.services.actions import fail_many

    fail_many(active, reasons, baseline_moves=True)


# --- the decision ------------------------------------------------------------------------------------------

def decide(*, cluster, faults: list[FaultEvent], dry_run: bool) -> list[int]:
    """Plan (and, unless dry-run, start) one recovery per affected job; close the faults. Returns action ids."""
    ctx = Context.of(cluster, dry_run=dry_run)
    now, tenant_id = ctx.now, cluster.dedicated_tenant_id
    # gather. Lock the faulty nodes before anything publishes: node services lock them too, and a transaction must
    # not wait for a row lock while it holds its topics' event-sequence rows (placement.immediate_constraints).
    nodes = placement.lock_nodes({fault.node_id for fault in faults})
    for fault in faults:
        fault.node = nodes[fault.node_id]
    verdicts = {fault.pk: FaultVerdict(**fault.triage) if fault.triage else FaultVerdict("none", False, True, True, "")
                for fault in faults}
    ladders = escalation.ladders_for([f.node_id for f in faults if verdicts[f.pk].escalates or verdicts[f.pk].out_of_service])
    on_nodes: dict[int, list[JobAllocation]] = {}
    for allocation in _active_allocations().filter(node_id__in={f.node_id for f in faults}):
        on_nodes.setdefault(allocation.node_id, []).append(allocation)
    # triage
    if not dry_run:
        _mark_hardware([(fault, verdicts[fault.pk]) for fault in faults])
    pairs: list[tuple[FaultEvent, Impact, JobAllocation]] = []
    outcome: dict[int, list[str]] = {}
    strikes: list = []
    for fault in faults:
        verdict = verdicts[fault.pk]
        impact = Impact(verdict.job_impact)
        step = escalation.on_fault(fault=fault, verdict=verdict, cluster=cluster, dry_run=dry_run, ladders=ladders,
                                   strikes=strikes)
        outcome[fault.pk] = [step.text] if step.text else []
        if impact == Impact.NONE and step.quarantined:
            impact = Impact.RISK    # repeated non-fatal faults: move protected jobs off before the node fails
        if impact == Impact.NONE:
            continue
        pairs.extend((fault, impact, allocation) for allocation in _affected(fault, impact, on_nodes))
    update_rows(strikes, escalation.STRIKE_FIELDS)
    jobs = _jobs_locked([p[2].job_id for p in pairs], {p[0].incident_id for p in pairs if p[0].incident_id})
    hits = group_hits(pairs, jobs, outcome)
    # A job already recovering: the new fault folds into that recovery, or replaces it (superseded).
    if not dry_run and any(job.recovering_now for job in jobs.values()):
        active, failovers = _under_way(jobs)
        hits, replaced = against_under_way(hits, active, failovers, outcome)
        supersede([a for a in active.values() if a.pk in replaced], replaced)
    # A job that this incident already recovered, hit by it again: it books no second baseline (one per incident
    # and job).
    booked = _booked(hits) if not dry_run else {}
    for hit in hits:
        if hit.retry is None:
            hit.booked_by = booked.get((hit.job.pk, hit.fault.incident_id))
    # plan and place: job-level hits first, then the NIC failovers beside them; spares go first to the jobs with the
    # most GPU-hours at stake, shared between tenants by tier.
    snapshots = snapshots_of(jobs.values())
    nics = healthy_nics_of({h.allocation.node_id for h in hits if h.impact in LINK_IMPACTS})
    stakes = [gpu_hours_at_stake(_facts(h.job, h.allocation, h.impact, h.fault, ctx.protected, ctx.overhead,
                                        snapshots.get(h.job.pk, []), now)[0]) for h in hits]
    ordered = fair_order([(h.job.tenant_id, h.job.tenant.tier, stakes[i], i) for i, h in enumerate(hits)])
    ordered.sort(key=lambda i: hits[i].link)
    created: list[RecoveryAction] = []
    recovering: list[tuple[Job, str]] = []
    job_level: set[int] = set()     # jobs given a job-level recovery by this decision
    for index in ordered:
        hit = hits[index]
        hit.only_link = hit.only_link or hit.job.pk in job_level
        action, note = plan_hit(ctx, hit, snapshots=snapshots.get(hit.job.pk, []),
                                healthy_nics=nics.get(hit.allocation.node_id, []))
        outcome[hit.fault.pk].append(note + (f" (replaces action {hit.retry.previous.pk})" if action and hit.retry
                                             else ""))
        if action is None:
            continue
        if action.kind not in LINK_KINDS:
            job_level.add(hit.job.pk)
        job = hit.job
        if not dry_run and action.kind in STOPS_JOB and job.state == JobState.RUNNING:
            job.iteration, job.iteration_at = job.iteration_now(now), now
            job.state = JobState.RECOVERING
            recovering.append((job, f"{hit.fault.kind} → {action.kind}"))
        created.append(action)
    refused = act(ctx, created) if not dry_run else []
    record(ctx, faults=faults, created=created, refused=refused, recovering=recovering, outcome=outcome,
           tenant_id=tenant_id)
    return [action.pk for action in created]


# --- act ---------------------------------------------------------------------------------------------------

def act(ctx: Context, created: list[RecoveryAction]) -> list[RecoveryAction]:
    """Start the decided actions through the driver, highest stake first, before they are written: an action the
    driver started is written running. Migrations over the budget stay planned and start from beat as room frees;
    a retry waiting out its back-off stays planned too. A proactive migration first takes a snapshot: a fresh
    restore point if the move goes wrong. Returns those the driver refused (``error`` says why)."""
    for action in created:
        if action.kind == ActionKind.PROACTIVE_MIGRATION:
            _snapshot_first(action.job)
    budget = None
    if any(action.kind in BUDGETED_KINDS for action in created):
        read = ctx.budget or placement.migration_budget(ctx.cluster)
        budget = replace(read, leaf_running=dict(read.leaf_running))   # starting counts in it: a copy
    refused = []
    for action in sorted(created, key=lambda a: -a.gpu_hours_at_stake):
        if action.retry_at and action.retry_at > ctx.now:
            continue
        if start_through_driver(action, ctx.cluster, budget, taken=ctx.booked) == "refused":
            refused.append(action)
    return refused


def _snapshot_first(job: Job) -> None:
    from controlplane.errors import ServiceError
    from jobs.choices import SnapshotReason
    from jobs.services.snapshots import snapshot_take

    try:
        with transaction.atomic():
            snapshot_take(actor=None, job=job, reason=SnapshotReason.PLANNER)
    except ServiceError:
        pass    # not running, not protected, or one already running: the migration goes ahead regardless


# --- record ------------------------------------------------------------------------------------------------

def record(ctx: Context, *, faults: list[FaultEvent], created: list[RecoveryAction], refused: list[RecoveryAction],
           recovering: list[tuple[Job, str]], outcome: dict[int, list[str]], tenant_id) -> None:
    """Write the decision together, one statement a table: the actions, their bookings (the unique constraint
    still refuses a spare booked twice), the jobs they stop, audit entries, the faults' outcomes, phases; then
    fail the ones the driver refused (each falls back) and publish."""
    from jobs.services.fallback import fail_and_fall_back

    RecoveryAction.objects.bulk_create(created)
    placement.book_many([b for b in map(booking_of, created) if b])
    update_rows([job for job, _ in recovering], ["iteration", "iteration_at", "state"])
    audit_record_many([audit_entry(actor=None, action="recovery.plan", target=action, tenant_id=action.job.tenant_id,
                                   changes={"kind": action.kind, "dry_run": ctx.dry_run, "fault": action.fault_id,
                                            "attempt": action.attempt})
                       for action in created])
    for fault in faults:
        notes = [note for note in outcome.get(fault.pk) or [] if note]
        ignore = (fault.triage or {}).get("ignore") or not notes
        text = "; ".join(notes) or "no job affected; nothing to do"
        if (fault.triage or {}).get("ignore"):
            text = f"the catalogue says {fault.triage.get('recommended_action')}: " + text
        fault.state = FaultState.IGNORED if ignore else FaultState.HANDLED
        fault.state_reason, fault.handled_at = text[:300], ctx.now
    update_rows(faults, ["state", "state_reason", "handled_at"])
    running = {action.pk for action in created if action.state == ActionState.RUNNING}
    for action in created:
        if action.pk in running:
            after_start(action)
    if recovering:
        phases_switch(at=ctx.now, ended=[(j.pk, phase_family(JobPhaseKind.RECOVERING)) for j, _ in recovering],
                      started=[JobPhase(job=j, kind=JobPhaseKind.RECOVERING, started_at=ctx.now, reason=why[:200])
                               for j, why in recovering],
                      progress=[JobProgress(job=j, at=ctx.now, iteration=j.iteration) for j, _ in recovering])
    if refused:
        fail_and_fall_back(ctx.cluster, [(action, action.error) for action in refused])
    # Publishing is the last statement before COMMIT: the topics' sequence rows it takes are shared by every
    # writer (fleet, cluster-<id>), so they are held only for that moment. The actions' events say what was
    # decided (started, or planned when dry-run or waiting) and carry their faults' state; a fault answered by
    # no action gets a fault.handled event of its own.
    answered = {action.fault_id for action in created}
    items = decision_lists(ctx.cluster, created, running)
    items += [(cluster_topics(fault.cluster_id, tenant_id), "fault.handled", fault_payload(fault),
               f"/api/v1/faults/{fault.pk}/") for fault in faults if fault.pk not in answered]
    events.publish_many(items)


def retry_backoff(attempt: int) -> timedelta:
    """How long the n-th retry of a failed restart waits (doubling from RECOVERY_RETRY_BACKOFF_SECONDS)."""
    return timedelta(seconds=settings.RECOVERY_RETRY_BACKOFF_SECONDS * 2 ** max(0, attempt - 1))
