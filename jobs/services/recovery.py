"""The decision for a batch of new faults of one cluster, in named stages:

    gather → triage → plan → place → act → record

Called by ``fault_handle`` with the cluster row locked, so it is the one placement decision of the cluster at
this moment. Everything happens in the caller's transaction: if the worker dies mid-way nothing is kept, the
faults stay new, and the sweep hands them out again.

One incident, one recovery (docs/incidents.md): the faults of a decision that hit one job are answered by one
action (the most severe decides; workers hit on several nodes restart the whole job), and a fault on a job whose
recovery is already under way folds into it, or replaces it when that recovery no longer answers it.
"""

from dataclasses import replace
from typing import NamedTuple

from django.db import transaction
from django.db.models import Exists, OuterRef

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import insert_rows, update_rows
from controlplane.prepared import PreparedQuery
from fleet.choices import GPUHealth, LinkState
from fleet.services import hardware
from jobs import placement
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    BUDGETED_KINDS,
    JOB_FAULT_KINDS,
    ActionKind,
    ActionState,
    FaultState,
    JobPhaseKind,
    JobState,
)
from jobs.models import FaultEvent, Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, RecoveryAction
from jobs.planner import (
    SPARE_KINDS,
    WHOLE_JOB_KINDS,
    Impact,
    fair_order,
    gpu_hours_at_stake,
)
from jobs.services import escalation
from jobs.services.actions import after_start, fail_many, start_through_driver
from jobs.services.fallback import fail_and_fall_back
from jobs.services.phases import phase_family, phases_switch
from jobs.services.planning import (
    LINK_IMPACTS,
    LINK_KINDS,
    Context,
    Hit,
    Retry,
    booking_of,
    facts_of,
    healthy_nics_of,
    plan_hit,
    snapshots_of,
)
from jobs.services.publishing import cluster_topics, decision_lists, fault_payload
from jobs.triage import FaultVerdict

STOPS_JOB = {
    ActionKind.INTRA_NODE_MIGRATION,
    ActionKind.LIVE_MIGRATION,
    ActionKind.GPU_RESET,
    ActionKind.RESTORE_FROM_SNAPSHOT,
    ActionKind.RESTART_FROM_CHECKPOINT,
    ActionKind.NIC_FAILOVER,
}


# --- gather ------------------------------------------------------------------------------------------------


def _active_allocations():
    return JobAllocation.objects.filter(
        released_at__isnull=True, job__state__in=(JobState.RUNNING, JobState.RECOVERING)
    ).select_related("node")


# The decision's reads of jobs, compiled once per process (controlplane/prepared.py): the ORM builds them once, with
# their EXISTS subqueries, and each decision only runs them.
_ALLOCATIONS_ON = PreparedQuery(
    lambda nodes: _active_allocations().filter(node_id__in_array=nodes), nodes=list[int]
)


def _jobs_locked_query(jobs, incidents):
    def actions(**conditions):
        return RecoveryAction.objects.filter(job_id=OuterRef("pk"), dry_run=False, **conditions)

    return (
        Job.objects.select_for_update(of=("self",), no_key=True)
        .select_related("tenant")
        .annotate(
            has_snapshots=Exists(JobSnapshot.objects.filter(job_id=OuterRef("pk"), state="succeeded")),
            recovering_now=Exists(actions(state__in=(ActionState.PLANNED, ActionState.RUNNING))),
            recovered_from_incident=Exists(
                actions(state=ActionState.SUCCEEDED, incident_id__in_array=incidents)
            ),
        )
        .filter(pk__in_array=jobs)
        .order_by("pk")
    )


_JOBS_LOCKED = PreparedQuery(_jobs_locked_query, jobs=list[int], incidents=list[int])


def _jobs_locked(job_ids, incident_ids) -> dict[int, Job]:
    """The jobs, row-locked, knowing whether they have snapshots, a recovery under way (job-level, or a NIC
    failover), and an action of one of these incidents that finished (and so booked the incident's baseline)."""
    if not job_ids:
        return {}
    return {
        row.pk: row for row in _JOBS_LOCKED.rows(jobs=sorted(set(job_ids)), incidents=sorted(incident_ids))
    }


def _under_way(jobs: dict[int, Job]) -> tuple[dict[int, RecoveryAction], set[tuple[int, int, str]]]:
    """The jobs' recoveries under way, row-locked: the job-level one by job, and their NIC failovers as (job, node,
    NIC)."""
    ids = [pk for pk, job in jobs.items() if job.recovering_now]
    active, failovers = {}, set()
    for action in (
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True).filter(
            job_id__in=ids, dry_run=False, state__in=ACTIVE_ACTION_STATES
        )
        if ids
        else ()
    ):
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
    rows = RecoveryAction.objects.filter(
        job_id__in=jobs,
        incident_id__in={h.fault.incident_id for h in hits},
        dry_run=False,
        state=ActionState.SUCCEEDED,
        gpu_hours_baseline__gt=0,
    ).order_by("pk")
    return {(action.job_id, action.incident_id): action for action in rows}


# --- triage ------------------------------------------------------------------------------------------------


def _affected(
    fault: FaultEvent, impact: str, on_nodes: dict[int, list[JobAllocation]]
) -> list[JobAllocation]:
    """The allocations a fault hits: on its node (``on_nodes``, fetched once per batch), or its whole rack."""
    if fault.kind == "facility" and fault.rack:
        found = list(_active_allocations().filter(node__cluster_id=fault.cluster_id, node__rack=fault.rack))
    else:
        found = on_nodes.get(fault.node_id, [])
    if impact == Impact.DEVICE and fault.gpu_index is not None:
        found = [a for a in found if fault.gpu_index in a.gpu_indices]
    job = (fault.details or {}).get("job") if fault.kind in JOB_FAULT_KINDS else None
    if job is not None:
        found = [a for a in found if str(a.job_id) == str(job)]  # a job's own failure hits only that job
    return found


def _mark_hardware(marks: list[tuple[FaultEvent, FaultVerdict]]) -> None:
    """Record on the fleet's rows what the faults took out: the GPUs, or the NICs' links."""
    gpus = [
        (fault.node_id, fault.gpu_index, GPUHealth.FAILED, verdict.explanation)
        for fault, verdict in marks
        if verdict.out_of_service and fault.gpu_index is not None
    ]
    links: dict[str, list[tuple[int, str]]] = {}
    for fault, verdict in marks:
        if fault.nic_name and verdict.job_impact in (Impact.NIC, Impact.DEGRADED):
            state = LinkState.DOWN if verdict.job_impact == Impact.NIC else LinkState.DEGRADED
            links.setdefault(state, []).append((fault.node_id, fault.nic_name))
    if gpus:
        hardware.gpus_mark(marks=gpus)
    for state, which in sorted(links.items()):
        hardware.nic_links_set(links=which, state=state)


class Affected(NamedTuple):
    """A worker a fault hit, and what the fault means for its job (the triage stage's output)."""

    fault: FaultEvent
    impact: Impact
    allocation: JobAllocation


def group_hits(pairs: list[Affected], jobs: dict[int, Job], outcome: dict[int, list[str]]) -> list[Hit]:
    """The hits of a decision from its (fault, impact, allocation) pairs. Per job: one job-level hit, decided by
    the most severe pair (workers stopped on two or more nodes make it a whole-job restart); and one link hit per
    NIC down or degraded on a node whose worker that recovery does not stop. Faults that decide nothing are noted
    as folded into the one that does."""
    by_job: dict[int, list[Affected]] = {}
    for pair in pairs:
        by_job.setdefault(pair.allocation.job_id, []).append(pair)
    hits = []
    for job_id, mine in by_job.items():
        mine.sort(key=lambda p: (p.impact.rank, p.fault.received_at, p.fault.pk))
        job_level = [p for p in mine if p.impact not in LINK_IMPACTS]
        main = None
        if job_level:
            fault, impact, allocation = job_level[0]
            stopped = {p.allocation.node_id for p in job_level if p.impact.stops_job}
            if len(stopped) > 1:
                impact = Impact.RESTART
            faults = list({p.fault.pk: p.fault for p in job_level}.values())
            main = Hit(
                job=jobs[job_id],
                fault=fault,
                impact=impact,
                allocation=allocation,
                nodes=stopped or {allocation.node_id},
            )
            hits.append(main)
            _fold(outcome, [f for f in faults if f.pk != fault.pk], job_id, fault)
        links: dict[tuple[int, str], Hit] = {}
        for fault, impact, allocation in (p for p in mine if p.impact in LINK_IMPACTS):
            if main is not None and main.impact.stops_job and allocation.node_id in main.nodes:
                _fold(outcome, [fault], job_id, main.fault)  # its worker leaves that node anyway
            elif (allocation.node_id, fault.nic_name) in links:
                _fold(outcome, [fault], job_id, links[allocation.node_id, fault.nic_name].fault)
            else:
                links[allocation.node_id, fault.nic_name] = Hit(
                    job=jobs[job_id],
                    fault=fault,
                    impact=impact,
                    allocation=allocation,
                    link=True,
                    nodes={allocation.node_id},
                    only_link=main is not None,
                )
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
    if active.kind == ActionKind.LIVE_MIGRATION or (
        active.kind == ActionKind.PROACTIVE_MIGRATION and active.state == ActionState.RUNNING
    ):
        return True
    return Impact(active.impact or Impact.NONE).rank <= hit.impact.rank


def against_under_way(
    hits: list[Hit],
    active: dict[int, RecoveryAction],
    failovers: set[tuple[int, int, str]],
    outcome: dict[int, list[str]],
) -> tuple[list[Hit], dict[int, str]]:
    """Weigh each hit against the job's recoveries under way (``active``: its job-level one; ``failovers``: (job,
    node, NIC) of its NIC failovers): it folds into one that answers it, or, for a job-level hit, replaces the
    job's recovery (returned: the actions superseded, with why) — as its next attempt, or, when what it replaces
    was only a move off a node at risk and the failure is elsewhere, as a recovery of its own. Returns the hits
    still to plan."""
    replaced: dict[int, str] = {}
    left = []
    for hit in hits:
        running = active.get(hit.job.pk)
        if hit.link and (hit.job.pk, hit.allocation.node_id, hit.fault.nic_name) in failovers:
            outcome[hit.fault.pk].append(
                f"job {hit.job.pk}: its failover of {hit.fault.nic_name} is under way"
            )
            continue
        if running is not None and (
            covers(running, hit)
            if not hit.link
            else running.kind in WHOLE_JOB_KINDS
            or (running.node_id == hit.allocation.node_id and running.kind in SPARE_KINDS)
        ):
            outcome[hit.fault.pk].append(
                f"job {hit.job.pk}: folded into its {running.kind} (action {running.pk})"
            )
            continue
        if running is not None and hit.link:
            hit.only_link = True
        elif running is not None:
            replaced[running.pk] = (
                f"superseded by fault {hit.fault.pk} ({hit.fault.kind} on {hit.fault.node.hostname})"
            )
            elsewhere = hit.allocation.node_id != running.node_id
            if not (elsewhere and running.kind == ActionKind.PROACTIVE_MIGRATION):
                # (A move off a node at risk gives way to a failure elsewhere, which gets a recovery of its own.)
                if elsewhere:
                    hit.impact = Impact.RESTART  # workers on two nodes are hit now: the whole job restarts
                hit.retry = Retry(previous=running, baseline=running.gpu_hours_baseline)
        left.append(hit)
    return left, replaced


# --- plan and place: jobs.services.planning -----------------------------------------------------------------


def supersede(active: list[RecoveryAction], reasons: dict[int, str], hits: list[Hit]) -> None:
    """End recoveries that a new fault replaces: failed, "superseded by …", their spares back in the pool; the
    baseline of those a next attempt carries on passes to it (booked once per recovery)."""
    carried_on = {hit.retry.previous.pk for hit in hits if hit.retry}
    fail_many([a for a in active if a.pk in carried_on], reasons, baseline_moves=True)
    fail_many([a for a in active if a.pk not in carried_on], reasons)


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
        fault.node.cluster = cluster
    verdicts = {
        fault.pk: FaultVerdict(**fault.triage)
        if fault.triage
        else FaultVerdict("none", False, True, True, "")
        for fault in faults
    }
    ladders = escalation.ladders_for(
        [f.node_id for f in faults if verdicts[f.pk].escalates or verdicts[f.pk].out_of_service]
    )
    on_nodes: dict[int, list[JobAllocation]] = {}
    for allocation in _ALLOCATIONS_ON.rows(nodes=sorted({f.node_id for f in faults})):
        on_nodes.setdefault(allocation.node_id, []).append(allocation)
    # triage
    if not dry_run:
        _mark_hardware([(fault, verdicts[fault.pk]) for fault in faults])
    pairs: list[Affected] = []
    outcome: dict[int, list[str]] = {}
    strikes: list = []
    quarantines: list = []
    for fault in faults:
        verdict = verdicts[fault.pk]
        impact = Impact(verdict.job_impact)
        step = escalation.on_fault(
            fault=fault,
            verdict=verdict,
            cluster=cluster,
            dry_run=dry_run,
            ladders=ladders,
            strikes=strikes,
            quarantines=quarantines,
        )
        outcome[fault.pk] = [step.text] if step.text else []
        if impact == Impact.NONE and step.quarantined:
            impact = Impact.RISK  # repeated non-fatal faults: move protected jobs off before the node fails
        if impact == Impact.NONE:
            continue
        pairs.extend(Affected(fault, impact, allocation) for allocation in _affected(fault, impact, on_nodes))
    update_rows(strikes, escalation.STRIKE_FIELDS)
    # the quarantined nodes are cordoned together, before anything is planned (a spare is never a cordoned node)
    texts = escalation.quarantine_many(quarantines)
    for ladder in quarantines:
        outcome[ladder.fault.pk][0] = texts[ladder.node_id]
    jobs = _jobs_locked(
        [p.allocation.job_id for p in pairs], {p.fault.incident_id for p in pairs if p.fault.incident_id}
    )
    hits = group_hits(pairs, jobs, outcome)
    # A job already recovering: the new fault folds into that recovery, or replaces it (superseded).
    if not dry_run and any(job.recovering_now for job in jobs.values()):
        active, failovers = _under_way(jobs)
        hits, replaced = against_under_way(hits, active, failovers, outcome)
        supersede([a for a in active.values() if a.pk in replaced], replaced, hits)
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
    local_gpus = placement.spare_gpus_on_nodes(
        {h.allocation.node_id for h in hits if h.impact == Impact.DEVICE}
    )
    stakes = [
        gpu_hours_at_stake(
            facts_of(
                h.job,
                h.allocation,
                h.impact,
                h.fault,
                ctx.protected_for(h.job, h.fault.detected_at),
                ctx.restart_for(h.job).seconds,
                snapshots.get(h.job.pk, []),
                now,
            )[0]
        )
        for h in hits
    ]
    ordered = fair_order([(h.job.tenant_id, h.job.tenant.tier, stakes[i], i) for i, h in enumerate(hits)])
    ordered.sort(key=lambda i: hits[i].link)
    created: list[RecoveryAction] = []
    recovering: list[tuple[Job, str]] = []
    job_level: set[int] = set()  # jobs given a job-level recovery by this decision
    for index in ordered:
        hit = hits[index]
        hit.only_link = hit.only_link or hit.job.pk in job_level
        action, note = plan_hit(
            ctx,
            hit,
            snapshots=snapshots.get(hit.job.pk, []),
            healthy_nics=nics.get(hit.allocation.node_id, []),
            spare_gpus=local_gpus.get(hit.allocation.node_id, []),
        )
        outcome[hit.fault.pk].append(
            note + (f" (replaces action {hit.retry.previous.pk})" if action and hit.retry else "")
        )
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
    record(
        ctx,
        faults=faults,
        created=created,
        refused=refused,
        recovering=recovering,
        outcome=outcome,
        tenant_id=tenant_id,
        stays=[hit for hit in hits if hit.stayed is not None],
    )
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
        budget = replace(read, leaf_running=dict(read.leaf_running))  # starting counts in it: a copy
    refused = []
    for action in sorted(created, key=lambda a: -a.gpu_hours_at_stake):
        if action.retry_at and action.retry_at > ctx.now:
            continue
        if start_through_driver(action, ctx.cluster, budget, taken=ctx.booked, pool=ctx.spares) == "refused":
            refused.append(action)
    return refused


def run_degraded(ctx: Context, stays: list[Hit]) -> None:
    """Jobs whose cheapest choice was to keep running on a degraded link: they run slower from now until the link
    is clean again (jobs.services.links fails them back); the fault keeps the comparison that decided it."""
    jobs, phases, progress = {}, [], []
    for hit in stays:
        job, stay = hit.job, hit.stayed.stay
        if job.pk not in jobs:
            job.iteration, job.iteration_at = job.iteration_now(ctx.now), ctx.now
            progress.append(JobProgress(job=job, at=ctx.now, iteration=job.iteration))
        job.slowdown, job.degraded_until = (
            max(job.slowdown if job.degraded_at(ctx.now) else 0.0, stay.slowdown),
            None,
        )
        jobs[job.pk] = job
        phases.append(
            JobPhase(
                job=job,
                kind=JobPhaseKind.DEGRADED,
                started_at=ctx.now,
                node_id=hit.allocation.node_id,
                nic_name=hit.fault.nic_name,
                reason=f"on degraded {hit.fault.nic_name or 'link'} of "
                f"{hit.allocation.node.hostname}: {stay.kind} was cheapest"[:200],
            )
        )
        hit.fault.details = {**(hit.fault.details or {}), "decision": hit.stayed.comparison()}
    update_rows(list(jobs.values()), ["iteration", "iteration_at", "slowdown", "degraded_until"])
    update_rows([hit.fault for hit in stays], ["details"])
    phases_switch(
        at=ctx.now,
        ended=[(pk, phase_family(JobPhaseKind.DEGRADED)) for pk in jobs],
        started=list({p.job_id: p for p in phases}.values()),
        progress=progress,
    )


def _snapshot_first(job: Job) -> None:
    from controlplane.errors import ServiceError
    from jobs.choices import SnapshotReason
    from jobs.services.snapshots import snapshot_take

    try:
        with transaction.atomic():
            snapshot_take(actor=None, job=job, reason=SnapshotReason.PLANNER)
    except ServiceError:
        pass  # not running, not protected, or one already running: the migration goes ahead regardless


# --- record ------------------------------------------------------------------------------------------------


def record(
    ctx: Context,
    *,
    faults: list[FaultEvent],
    created: list[RecoveryAction],
    refused: list[RecoveryAction],
    recovering: list[tuple[Job, str]],
    outcome: dict[int, list[str]],
    tenant_id,
    stays: list[Hit] = (),
) -> None:
    """Write the decision together, one statement a table: the actions, their bookings (the unique constraint
    still refuses a spare booked twice), the jobs they stop, the jobs that run on degraded, audit entries, the
    faults' outcomes, phases; then fail the ones the driver refused (each falls back) and publish."""
    insert_rows(created)
    placement.book_many([b for b in map(booking_of, created) if b])
    update_rows([job for job, _ in recovering], ["iteration", "iteration_at", "state"])
    audit_record_many(
        [
            audit_entry(
                actor=None,
                action="recovery.plan",
                target=action,
                tenant_id=action.job.tenant_id,
                changes={
                    "kind": action.kind,
                    "dry_run": ctx.dry_run,
                    "fault": action.fault_id,
                    "attempt": action.attempt,
                },
            )
            for action in created
        ]
    )
    for fault in faults:
        notes = [note for note in outcome.get(fault.pk) or [] if note]
        ignore = (fault.triage or {}).get("ignore") or not notes
        text = "; ".join(notes) or "no job affected; nothing to do"
        if (fault.triage or {}).get("ignore"):
            text = f"the catalogue says {fault.triage.get('recommended_action')}: " + text
        fault.state = FaultState.IGNORED if ignore else FaultState.HANDLED
        fault.state_reason, fault.handled_at = text[:300], ctx.now
    update_rows(faults, ["state", "state_reason", "handled_at"])
    if stays:
        run_degraded(ctx, stays)
    running = {action.pk for action in created if action.state == ActionState.RUNNING}
    for action in created:
        if action.pk in running:
            after_start(action)
    if recovering:
        phases_switch(
            at=ctx.now,
            ended=[(j.pk, phase_family(JobPhaseKind.RECOVERING)) for j, _ in recovering],
            started=[
                JobPhase(job=j, kind=JobPhaseKind.RECOVERING, started_at=ctx.now, reason=why[:200])
                for j, why in recovering
            ],
            progress=[JobProgress(job=j, at=ctx.now, iteration=j.iteration) for j, _ in recovering],
        )
    if refused:
        fail_and_fall_back(ctx.cluster, [(action, action.error) for action in refused])
    # Publishing is the last statement before COMMIT: the topics' sequence rows it takes are shared by every
    # writer (fleet, cluster-<id>), so they are held only for that moment. The actions' events say what was
    # decided (started, or planned when dry-run or waiting) and carry their faults' state; a fault answered by
    # no action gets a fault.handled event of its own.
    answered = {action.fault_id for action in created}
    items = decision_lists(ctx.cluster, created, running)
    items += [
        (
            cluster_topics(fault.cluster_id, tenant_id),
            "fault.handled",
            fault_payload(fault),
            f"/api/v1/faults/{fault.pk}/",
        )
        for fault in faults
        if fault.pk not in answered
    ]
    events.publish_many(items)
