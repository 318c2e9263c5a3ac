"""The decision for a batch of new faults of one cluster: triage, ladder, cost-ranked plan, placement.

Called by ``fault_handle`` with the cluster row locked, so it is the one placement decision of the cluster
at this moment. Everything happens in the caller's transaction: if the worker dies mid-way nothing is kept,
the faults stay new, and the sweep hands them out again.
"""

import functools
import math
import operator
from dataclasses import replace

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from fleet.choices import GPUHealth, LinkState
from fleet.models import GPU, NIC
from jobs import placement
from jobs.choices import BUDGETED_KINDS, ActionKind, ActionState, FaultState, JobPhaseKind, JobState
from jobs.models import FaultEvent, Job, JobAllocation, JobPhase, JobProgress, JobSnapshot, RecoveryAction
from jobs.planner import JobFacts, Situation, fair_order, gpu_hours_at_stake, plan, plan_with_spare_lookup
from jobs.services import escalation
from jobs.services.actions import after_start, fail_action, start_through_driver
from jobs.services.common import (
    action_payload,
    cluster_topics,
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


def _active_allocations():
    return (JobAllocation.objects.filter(released_at__isnull=True, job__state__in=(JobState.RUNNING, JobState.RECOVERING))
            .select_related("node"))


def _affected(fault: FaultEvent, impact: str, on_nodes: dict[int, list[JobAllocation]]) -> list[JobAllocation]:
    """The allocations a fault hits: on its node (``on_nodes``, fetched once per batch), or its whole rack."""
    if fault.kind == "facility" and fault.rack:
        found = list(_active_allocations().filter(node__cluster_id=fault.cluster_id, node__rack=fault.rack))
    else:
        found = on_nodes.get(fault.node_id, [])
    if impact == "device" and fault.gpu_index is not None:
        found = [a for a in found if fault.gpu_index in a.gpu_indices]
    return found


def _facts(job: Job, allocation: JobAllocation, impact: str, fault: FaultEvent, protected: bool,
           overhead: float, snapshots: list[JobSnapshot]) -> tuple[JobFacts, JobSnapshot | None]:
    at = min(fault.detected_at, timezone.now())
    iteration = job.iteration_now(at)
    checkpoint = job.checkpoint_iteration_now(at)
    since_checkpoint = max(0, iteration - checkpoint) * job.seconds_per_iteration
    usable = [s for s in snapshots if checkpoint < s.iteration <= iteration]
    snapshot = max(usable, key=lambda s: s.iteration) if usable else None
    since_snapshot = (iteration - snapshot.iteration) * job.seconds_per_iteration if snapshot else None
    affected = 1 if impact == "device" else allocation.gpu_count
    return JobFacts(gpus=job.gpus, gpus_affected=affected, seconds_since_checkpoint=since_checkpoint,
                    protected=protected, restart_overhead_seconds=overhead, seconds_since_snapshot=since_snapshot), snapshot


def _mark_hardware(marks: list[tuple[FaultEvent, FaultVerdict]]) -> None:
    """Record on the fleet's rows what the faults took out: the GPUs, or the NICs' links (the links in one
    statement per new state)."""
    links: dict[str, list[Q]] = {}
    for fault, verdict in marks:
        if verdict.out_of_service and fault.gpu_index is not None:
            GPU.objects.filter(node_id=fault.node_id, index=fault.gpu_index).update(
                health=GPUHealth.FAILED, health_reason=verdict.explanation[:300])
        if fault.nic_name and verdict.job_impact in ("nic", "degraded"):
            state = LinkState.DOWN if verdict.job_impact == "nic" else LinkState.DEGRADED
            links.setdefault(state, []).append(Q(node_id=fault.node_id, name=fault.nic_name))
    for state, which in sorted(links.items()):
        NIC.objects.filter(functools.reduce(operator.or_, which)).update(link_state=state)


def decision_lists(cluster, created: list[RecoveryAction], started: set[int]) -> list[events.Item]:
    """A decision's actions as ``actions.decided`` lists (see ``action_lists``)."""
    if not created:
        return []
    payloads = []
    for action in created:
        kind = "action.started" if action.pk in started else "action.planned"
        payloads.append((action, {**action_payload(action), "event": kind}))
    return action_lists(cluster.pk, payloads, "actions.decided", "decided")


def action_lists(cluster_id: int, payloads: list, kind: str, verb: str) -> list[events.Item]:
    """Events listing a batch of actions: all of them on the cluster's and the fleet's topics, each tenant's own
    on that tenant's topic, and each job's own on the job's topic (no tenant ever sees another's). Fewer, larger
    events, all written by one ``publish_many``: the topics' shared sequence rows are taken once, together, in
    one global order, and held only for the moment before COMMIT."""
    every = [p for _, p in payloads]
    items: list[events.Item] = [
        ([events.topic("cluster", cluster_id), events.topic("fleet")], kind,
         {"actions": every, "cluster": cluster_id, "summary": f"{len(every)} recovery action(s) {verb}"},
         f"/api/v1/actions/?cluster={cluster_id}")]
    by_tenant: dict[int, list] = {}
    by_job: dict[int, list] = {}
    for action, payload in payloads:
        by_tenant.setdefault(action.job.tenant_id, []).append(payload)
        by_job.setdefault(action.job_id, []).append(payload)
    for tenant_id, mine in sorted(by_tenant.items()):
        items.append(([events.topic("tenant", tenant_id)], kind,
                      {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"}, "/api/v1/actions/"))
    for job_id, mine in sorted(by_job.items()):
        items.append(([events.topic("job", job_id)], kind,
                      {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"},
                      f"/api/v1/actions/?job={job_id}"))
    return items


def _snapshot_first(job: Job) -> None:
    """Before a proactive migration, take a platform snapshot: a fresh restore point if the move goes wrong."""
    from controlplane.errors import ServiceError
    from jobs.choices import SnapshotReason
    from jobs.services.snapshots import snapshot_take

    try:
        with transaction.atomic():
            snapshot_take(actor=None, job=job, reason=SnapshotReason.PLANNER)
    except ServiceError:
        pass    # not running, not protected, or one already running: the migration goes ahead regardless


def _close(fault: FaultEvent, state: str, reason: str, at) -> None:
    """Set a fault's outcome (the caller writes it)."""
    fault.state = state
    fault.state_reason = reason[:300]
    fault.handled_at = at


def decide(*, cluster, faults: list[FaultEvent], dry_run: bool) -> list[int]:
    """Plan (and, unless dry-run, start) one recovery per affected job and fault; close the faults."""
    now = timezone.now()
    est = estimates_for(cluster)
    supports = supported_operations(cluster)
    protection = protection_of(cluster, max_age=2.0)
    overhead = cluster.restart_overhead_minutes * 60.0
    tenant_id = cluster.dedicated_tenant_id
    # Lock the faulty nodes before anything publishes: node services lock them too, and a transaction must not
    # wait for a row lock while it holds its topics' event-sequence rows (see placement.immediate_constraints).
    nodes = placement.lock_nodes({fault.node_id for fault in faults})
    for fault in faults:
        fault.node = nodes[fault.node_id]
    verdicts = {fault.pk: FaultVerdict(**fault.triage) if fault.triage else FaultVerdict("none", False, True, True, "")
                for fault in faults}
    ladders = escalation.ladders_for([f.node_id for f in faults if verdicts[f.pk].escalates or verdicts[f.pk].out_of_service])
    on_nodes: dict[int, list[JobAllocation]] = {}
    for allocation in _active_allocations().filter(node_id__in={f.node_id for f in faults}):
        on_nodes.setdefault(allocation.node_id, []).append(allocation)
    if not dry_run:
        _mark_hardware([(fault, verdicts[fault.pk]) for fault in faults])
    pairs = []
    outcome: dict[int, list[str]] = {}
    strikes: list = []
    for fault in faults:
        verdict = verdicts[fault.pk]
        impact = verdict.job_impact
        ladder = escalation.on_fault(fault=fault, verdict=verdict, cluster=cluster, dry_run=dry_run, ladders=ladders,
                                     strikes=strikes)
        outcome[fault.pk] = [ladder] if ladder else []
        if impact == "none" and ladder.startswith("quarantined"):
            impact = "risk"     # repeated non-fatal faults: move protected jobs off before the node fails
        if impact == "none":
            continue
        for allocation in _affected(fault, impact, on_nodes):
            pairs.append((fault, impact, allocation))
    update_rows(strikes, escalation.STRIKE_FIELDS)
    # No fault here has an action yet: the faults are new and row-locked, and a fault's actions are written only
    # in the transaction that closes it (nothing reopens a fault). The unique constraint on (fault, job) stands
    # behind that: a second action for a pair would roll the whole decision back.
    jobs = {job.pk: job for job in Job.objects.select_for_update(of=("self",), no_key=True).select_related("tenant")
            .annotate(has_snapshots=Exists(JobSnapshot.objects.filter(job=OuterRef("pk"), state="succeeded")))
            .filter(pk__in={p[2].job_id for p in pairs}).order_by("pk")}
    snapshots: dict[int, list[JobSnapshot]] = {}
    with_snapshots = [pk for pk, job in jobs.items() if job.has_snapshots]
    for snapshot in JobSnapshot.objects.filter(job_id__in=with_snapshots, state="succeeded") if with_snapshots else ():
        snapshots.setdefault(snapshot.job_id, []).append(snapshot)
    up_nics: dict[int, list[str]] = {}
    for node_id, name in (NIC.objects.filter(node_id__in={p[2].node_id for p in pairs if p[1] in ("nic", "degraded")},
                                             link_state=LinkState.UP).order_by("rail").values_list("node_id", "name")):
        up_nics.setdefault(node_id, []).append(name)
    priced = []
    for fault, impact, allocation in pairs:
        job = jobs[allocation.job_id]
        facts, snapshot = _facts(job, allocation, impact, fault, protection.protected, overhead, snapshots.get(job.pk, []))
        priced.append((fault, impact, allocation, job, facts, snapshot, gpu_hours_at_stake(facts)))
    # Spares go first to the jobs with the most GPU-hours at stake, shared between tenants by tier.
    ordered = fair_order([(p[3].tenant_id, p[3].tenant.tier, p[6], i) for i, p in enumerate(priced)])
    spares = placement.SparePool(cluster)
    budgets: list[placement.Budget] = []   # the migration budget, read when a recovery first needs a spare node
    queued = 0                             # budgeted moves this decision queued
    booked: set[int] = set()
    created: list[RecoveryAction] = []
    bookings: list[tuple[RecoveryAction, object]] = []
    recovering: list[tuple[Job, str]] = []

    def spare_for(node, gpus: int) -> tuple[object, float]:
        """The spare node for a worker leaving ``node``, and the wait for the budget to move it there."""
        if not budgets:
            budgets.append(placement.migration_budget(cluster))
        budget = budgets[0]
        wait = replace(budget, queued=budget.queued + queued).wait_seconds(est.migration_pause)
        return spares.pick(near=node, gpus=gpus, exclude=booked), wait

    for index in ordered:
        fault, impact, allocation, job, facts, snapshot, stake = priced[index]
        node = allocation.node
        spare_gpus = placement.spare_gpus_on_node(node) if impact == "device" and facts.protected else []
        spare_nic = next((n for n in up_nics.get(node.pk, []) if n != fault.nic_name), None)
        situation = Situation(impact=impact, healthy_nic=spare_nic is not None, spare_gpus_on_node=len(spare_gpus),
                              gpu_reset=(fault.triage or {}).get("remediation") == "gpu_reset",
                              risk=max(node.risk_score, 0.5), supports=supports)
        found = []

        def look_up(node=node, gpus=allocation.gpu_count, found=found) -> tuple[bool, float]:
            spare, wait = spare_for(node, gpus)
            found.append(spare)
            return spare is not None and wait != math.inf, min(wait, 1e9)

        if impact in ("device", "node", "nic", "risk") and facts.protected:
            # The spare pool is read only when a spare could beat the recoveries that need none.
            decision, _ = plan_with_spare_lookup(facts, situation, est, look_up)
        else:
            decision = plan(facts, situation, est)
        spare = found[0] if found else None
        if decision.chosen is None:
            outcome[fault.pk].append(f"job {job.pk}: {decision.options[0].why if decision.options else 'nothing to do'}"
                                     if decision.options else f"job {job.pk}: no action needed")
            continue
        chosen = decision.chosen
        action = RecoveryAction(
            fault=fault, job=job, cluster=cluster, kind=chosen.kind, dry_run=dry_run, node=node,
            detected_at=fault.detected_at, planned_at=now, gpus=job.gpus, pause_seconds=chosen.pause_seconds,
            work_lost_seconds=chosen.work_lost_seconds, degraded_seconds=chosen.degraded_seconds,
            slowdown=chosen.slowdown, gpu_hours_lost=chosen.gpu_hours_lost, gpu_hours_baseline=decision.baseline,
            gpu_hours_saved=decision.baseline - chosen.gpu_hours_lost, gpu_hours_at_stake=stake,
            reason=decision.reason, alternatives=[o.as_dict() for o in decision.options],
            gpu_index=fault.gpu_index, nic_name=fault.nic_name,
        )
        if chosen.kind in (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION):
            action.to_node = spare
        if chosen.kind == ActionKind.INTRA_NODE_MIGRATION:
            action.to_node, action.to_gpu_index = node, spare_gpus[0]
        if chosen.kind == ActionKind.NIC_FAILOVER:
            action.to_nic_name = spare_nic
        if chosen.kind == ActionKind.RESTORE_FROM_SNAPSHOT:
            action.snapshot, action.restore_iteration = snapshot, snapshot.iteration
        if chosen.kind == ActionKind.RESTART_FROM_CHECKPOINT:
            action.restore_iteration = job.checkpoint_iteration_now(min(fault.detected_at, now))
        bookings.append((action, spare if chosen.kind != ActionKind.INTRA_NODE_MIGRATION else node))
        if action.to_node_id and chosen.kind != ActionKind.INTRA_NODE_MIGRATION:
            booked.add(spare.pk)
        if chosen.kind in BUDGETED_KINDS:
            queued += 1
        if not dry_run and chosen.kind in STOPS_JOB and job.state == JobState.RUNNING:
            job.iteration, job.iteration_at = job.iteration_now(now), now
            job.state = JobState.RECOVERING
            recovering.append((job, f"{fault.kind} → {chosen.kind}"))
        outcome[fault.pk].append(f"job {job.pk}: {chosen.kind}" + (" (dry run)" if dry_run else ""))
        created.append(action)
    # Start them, highest stake first, before writing them: an action the driver started is written running.
    # Migrations over the budget stay planned and start from beat as room frees. A proactive migration first
    # takes a snapshot: a fresh restore point if the move goes wrong.
    refused: list[RecoveryAction] = []
    if not dry_run:
        for action in created:
            if action.kind == ActionKind.PROACTIVE_MIGRATION:
                _snapshot_first(action.job)
        budget = None
        if any(action.kind in BUDGETED_KINDS for action in created):
            read = budgets[0] if budgets else placement.migration_budget(cluster)
            budget = replace(read, leaf_running=dict(read.leaf_running))   # starting counts in it: a copy
        for action in sorted(created, key=lambda a: -a.gpu_hours_at_stake):
            if start_through_driver(action, cluster, budget) == "refused":
                refused.append(action)
    # Written together: the actions, their bookings (the unique constraint still refuses a spare booked twice),
    # the jobs they stop, their audit entries and the faults' outcomes, one statement each.
    RecoveryAction.objects.bulk_create(created)
    placement.book_many([(action, node, action.to_gpu_index if action.kind == ActionKind.INTRA_NODE_MIGRATION else None)
                         for action, node in bookings if action.to_node_id])
    update_rows([job for job, _ in recovering], ["iteration", "iteration_at", "state"])
    audit_record_many([audit_entry(actor=None, action="recovery.plan", target=action, tenant_id=action.job.tenant_id,
                                   changes={"kind": action.kind, "dry_run": dry_run, "fault": action.fault_id})
                       for action in created])
    for fault in faults:
        notes = outcome.get(fault.pk) or []
        ignore = (fault.triage or {}).get("ignore") or not notes
        text = "; ".join(notes) or "no job affected; nothing to do"
        if (fault.triage or {}).get("ignore"):
            text = f"the catalogue says {fault.triage.get('recommended_action')}: " + text
        _close(fault, FaultState.IGNORED if ignore else FaultState.HANDLED, text, now)
    update_rows(faults, ["state", "state_reason", "handled_at"])
    for action in refused:
        fail_action(action, action.error)
    started = {action.pk for action in created if action.state == ActionState.RUNNING}
    for action in created:
        if action.pk in started:
            after_start(action)
    if recovering:
        phases_switch(at=now, ended=[(j.pk, phase_family(JobPhaseKind.RECOVERING)) for j, _ in recovering],
                      started=[JobPhase(job=j, kind=JobPhaseKind.RECOVERING, started_at=now, reason=why[:200])
                               for j, why in recovering],
                      progress=[JobProgress(job=j, at=now, iteration=j.iteration) for j, _ in recovering])
    # Publishing is the last statement before COMMIT: the topics' sequence rows it takes are shared by every
    # writer (fleet, cluster-<id>), so they are held only for that moment. The actions' events say what was
    # decided (started, or planned when dry-run or waiting) and carry their faults' state; a fault answered by
    # no action gets a fault.handled event of its own.
    answered = {action.fault_id for action in created}
    items = decision_lists(cluster, created, started)
    items += [(cluster_topics(fault.cluster_id, tenant_id), "fault.handled", fault_payload(fault),
               f"/api/v1/faults/{fault.pk}/") for fault in faults if fault.pk not in answered]
    events.publish_many(items)
    return [action.pk for action in created]
