"""The per-node escalation ladder (NVSentinel's detect → quarantine → drain → remediate, with escalation):

    watching → quarantined (cordon) → draining → remediating (GPU reset) → repaired → validated → returned
                                               ↘ failed (reboot or a human) → repaired ↗

A fault that takes a GPU or the node out of service quarantines the node at once; non-fatal faults that
count toward escalation quarantine it when ESCALATION_STRIKES of them fall within ESCALATION_WINDOW_SECONDS.
Each later step is taken by beat (``escalation_advance``), as many in one call as are ready (a drain, a repair
checked and a check passed each let the next step follow at once; ``CHAINED_STAGES``), through the fleet's node
services (which enforce the fleet-wide cordon and drain caps and the share circuit breaker: a step refused over
a cap waits and retries). Paused automation (the cluster's, its fleet's or the provider's switch) holds every
ladder of the cluster where it stands.

Validation needs fresh evidence: a repaired node (by a human, or a GPU reset) gets a health check carried out
through its driver (``ClusterDriver.health_check``); a failed check sends it back to ``failed``. Where the node has
an agent (it had reported telemetry before the check), it must then report clean telemetry for
ESCALATION_CLEAN_TELEMETRY_SECONDS: it reports after the window ends, and no hardware fault
(``NODE_HARDWARE_KINDS``) is detected on it from the check on; a fault sends it back to ``failed``, and so does
silence for twice the window. What validation saw is kept on the ladder (``evidence``) and shown on the node's
cluster page.
"""

import copy
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record, audit_record_many
from controlplane.bulk import insert_rows, update_rows
from controlplane.errors import ServiceError
from controlplane.prepared import PreparedQuery
from fleet.choices import AutomationMode, GPUHealth, LinkState, NodeState
from fleet.drivers import DriverError, driver_for
from fleet.models import Node
from fleet.models.hardware import provider_automation
from fleet.services import nodes as node_services
from fleet.services.hardware import gpus_mark, node_gpus_mark, node_nic_links_set
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    NODE_HARDWARE_KINDS,
    ActionKind,
    ActionState,
    EscalationStage,
    JobState,
)
from jobs.models import FaultEvent, JobAllocation, NodeEscalation, RecoveryAction
from jobs.services.actions import spares_returned, waiting_for_spares
from jobs.services.publishing import cluster_topics, publish_action
from jobs.triage import FaultVerdict

OPEN_STAGES = (
    EscalationStage.QUARANTINED,
    EscalationStage.DRAINING,
    EscalationStage.REMEDIATING,
    EscalationStage.REPAIRED,
    EscalationStage.VALIDATED,
)


def _strikes(escalation: NodeEscalation, now: datetime) -> list[str]:
    window = timedelta(seconds=settings.ESCALATION_WINDOW_SECONDS)
    kept = [t for t in escalation.strikes if datetime.fromisoformat(t) >= now - window]
    return [*kept, now.isoformat()]


def _publish(escalation: NodeEscalation, kind: str) -> None:
    node = escalation.node
    events.publish(
        cluster_topics(node.cluster_id, node.cluster.dedicated_tenant_id),
        kind,
        {
            "node": node.pk,
            "hostname": node.hostname,
            "stage": escalation.stage,
            "reason": escalation.reason,
            "needs_human": escalation.needs_human,
            "blocked": escalation.blocked,
        },
        url=f"/api/v1/nodes/{node.pk}/",
    )


def _node_step(escalation: NodeEscalation, kind: str, *, handle: str = "", done_at=None) -> RecoveryAction:
    """Record a node-level step of the ladder as a RecoveryAction with no job (one per fault and kind). One moment
    stamps it: planned, started and (when it needs no waiting) ended at once, never out of order."""
    return _node_steps([escalation], kind, handle=handle, done_at=done_at)[0]


def _node_steps(
    escalations: list[NodeEscalation], kind: str, *, handle: str = "", done_at=None
) -> list[RecoveryAction]:
    """``_node_step`` for many ladders at once, in their order: a step already recorded for a ladder's fault is
    kept, the rest are created in one statement; each is published."""
    if not escalations:
        return []
    now = timezone.now()
    found = {
        (a.fault_id, a.node_id): a
        for a in RecoveryAction.objects.filter(
            fault_id__in={e.fault_id for e in escalations if e.fault_id}, job=None, kind=kind
        ).select_related("cluster")
    }
    missing = {
        e.pk: RecoveryAction(
            fault=e.fault,
            job=None,
            kind=kind,
            node=e.node,
            cluster=e.node.cluster,
            detected_at=min(e.fault.detected_at, now) if e.fault else now,
            state=ActionState.SUCCEEDED if not handle else ActionState.RUNNING,
            planned_at=now,
            started_at=now,
            ended_at=None if handle else now,
            handle=handle,
            done_at=done_at,
            reason=e.reason,
        )
        for e in escalations
        if not e.fault_id or (e.fault_id, e.node_id) not in found
    }
    insert_rows(list(missing.values()))
    steps = [missing.get(e.pk) or found[(e.fault_id, e.node_id)] for e in escalations]
    for action in steps:
        publish_action(action, f"action.{action.state}")
    return steps


def ladders_for(node_ids) -> dict[int, NodeEscalation]:
    """The ladders of these nodes, created where missing and row-locked, in one go for a batch of faults."""
    ids = sorted(set(node_ids))
    if not ids:
        return {}
    insert_rows([NodeEscalation(node_id=pk) for pk in ids], ignore_conflicts=True)
    return {row.node_id: row for row in _LADDERS_LOCKED.rows(nodes=ids)}


# Read on every decision: compiled once per process (controlplane/prepared.py).
_LADDERS_LOCKED = PreparedQuery(
    lambda nodes: (
        NodeEscalation.objects.select_for_update(no_key=True)
        .filter(node_id__in_array=nodes)
        .order_by("node_id")
    ),
    nodes=list[int],
)


@dataclass(frozen=True)
class LadderStep:
    """What a fault did on its node's ladder: whether it quarantined the node now, and what happened, in words."""

    quarantined: bool = False
    text: str = ""


STRIKE_FIELDS = ["stage", "strikes", "needs_human", "updated_at"]


def on_fault(
    *,
    fault: FaultEvent,
    verdict: FaultVerdict,
    cluster,
    dry_run: bool,
    ladders: dict[int, NodeEscalation] | None = None,
    strikes: list[NodeEscalation] | None = None,
    quarantines: list[NodeEscalation] | None = None,
) -> "LadderStep":
    """Record the fault on its node's ladder; quarantine (cordon) the node when the fault is fatal to a
    device or the node, or when strikes add up. Returns what happened (``LadderStep``).

    With ``strikes``, a ladder that only counted a strike is appended there for the caller to write (its
    ``STRIKE_FIELDS``, with the rest of a batch) instead of being saved here. With ``quarantines``, a ladder that
    quarantines its node is appended there, its node not yet cordoned: the caller's ``quarantine_many`` cordons
    the batch's nodes together and says, per ladder, how it went."""
    if not (verdict.out_of_service or verdict.escalates):
        return LadderStep()
    now = timezone.now()
    escalation = (ladders or {}).get(fault.node_id)
    if escalation is None:
        escalation, _ = NodeEscalation.objects.select_for_update(no_key=True).get_or_create(
            node_id=fault.node_id
        )
    escalation.node = fault.node
    if escalation.stage in OPEN_STAGES or escalation.stage == EscalationStage.FAILED:
        return LadderStep(text=f"ladder already at {escalation.stage}")
    if escalation.stage == EscalationStage.RETURNED:
        escalation.stage = EscalationStage.WATCHING
    escalation.strikes = _strikes(escalation, now)
    escalation.needs_human = escalation.needs_human or verdict.needs_human
    fatal = verdict.out_of_service
    if not fatal and len(escalation.strikes) < settings.ESCALATION_STRIKES:
        if strikes is None:
            escalation.save()
        else:
            escalation.updated_at = now
            strikes.append(escalation)
        return LadderStep(text=f"strike {len(escalation.strikes)} of {settings.ESCALATION_STRIKES}")
    escalation.fault = fault
    escalation.gpu_index = fault.gpu_index
    escalation.remediation = verdict.remediation
    escalation.reason = (
        verdict.explanation
        if fatal
        else f"{len(escalation.strikes)} faults within {settings.ESCALATION_WINDOW_SECONDS} s"
    )[:300]
    if dry_run:
        escalation.save()
        return LadderStep(quarantined=True, text="quarantined (dry run: the node was not cordoned)")
    escalation.stage = EscalationStage.QUARANTINED
    escalation.strikes = []
    escalation.blocked = ""
    if quarantines is not None:
        quarantines.append(escalation)
        return LadderStep(quarantined=True, text="quarantined")
    return LadderStep(quarantined=True, text=quarantine_many([escalation])[escalation.node_id])


QUARANTINE_FIELDS = [
    "stage",
    "strikes",
    "needs_human",
    "fault",
    "gpu_index",
    "remediation",
    "reason",
    "blocked",
    "updated_at",
]


def quarantine_many(escalations: list[NodeEscalation]) -> dict[int, str]:
    """Cordon the nodes of these ladders (set to quarantined by ``on_fault``) together, within the fleet's caps;
    record each cordon as the ladder's step, write the ladders and publish them. Returns, per node, what happened
    in words ("quarantined", or why its cordon waits)."""
    if not escalations:
        return {}
    _cordon_ladders(escalations)
    now = timezone.now()
    for escalation in escalations:
        escalation.updated_at = now
        _publish(escalation, "node.escalation")
    update_rows(escalations, QUARANTINE_FIELDS)
    return {e.node_id: "quarantined" + (f" ({e.blocked})" if e.blocked else "") for e in escalations}


@dataclass
class Presence:
    """What runs on some nodes, read once for a batch of ladders: per node, the running or recovering jobs with an
    allocation there, and whether one of them is being moved off it (an active recovery action from that node)."""

    jobs: dict[int, list[int]]
    moving: set[int]

    @classmethod
    def of(cls, node_ids) -> "Presence":
        jobs: dict[int, list[int]] = {}
        # A job whose restart waits for a spare (``actions._wait_for_spare``) is parked: its workers are stopped,
        # and its dead nodes go on to a repair (one repaired comes back to it) instead of waiting for it to leave.
        parked = waiting_for_spares().filter(job__isnull=False).values("job_id")
        for node_id, job_id in (
            JobAllocation.objects.filter(
                node_id__in=node_ids,
                released_at__isnull=True,
                job__state__in=(JobState.RUNNING, JobState.RECOVERING),
            )
            .exclude(job_id__in=parked)
            .values_list("node_id", "job_id")
            .distinct()
            .order_by("node_id", "job_id")
        ):
            jobs.setdefault(node_id, []).append(job_id)
        moving = (
            {
                node_id
                for node_id, job_id in RecoveryAction.objects.filter(
                    node_id__in=list(jobs), job__isnull=False, state__in=ACTIVE_ACTION_STATES
                ).values_list("node_id", "job_id")
                if job_id in jobs[node_id]
            }
            if jobs
            else set()
        )
        return cls(jobs, moving)


def _jobs_still_on(node: Node) -> list[int]:
    return Presence.of([node.pk]).jobs.get(node.pk, [])


def _evidence(escalation: NodeEscalation, step: str, result: str, detail: str, *, at=None) -> None:
    """Keep what validation saw on the ladder's record (the newest 50 entries)."""
    entry = {"at": (at or timezone.now()).isoformat(), "step": step, "result": result, "detail": detail[:300]}
    escalation.evidence = [*(escalation.evidence or []), entry][-50:]


def _back_to_failed(escalation: NodeEscalation, node: Node, why: str) -> str:
    """Validation failed: the node goes back to ``failed`` and waits for another repair (a human)."""
    node_services.node_mark_failed(actor=None, node=node, reason=f"validation failed: {why}")
    escalation.stage, escalation.needs_human = EscalationStage.FAILED, True
    escalation.check_handle, escalation.check_started_at, escalation.check_passed_at = "", None, None
    escalation.blocked = f"validation failed ({why}); waits for a repair, then POST repaired"[:300]
    return "failed"


def _health_check(escalation: NodeEscalation, node: Node) -> str:
    """Start the repaired node's health check through its driver, or read how it went: passed → validated (and,
    with an agent, the clean-telemetry window starts), failed → back to failed."""
    driver = driver_for(node.cluster)
    if not escalation.check_handle:
        try:
            result = driver.health_check(node)
        except DriverError as error:
            escalation.blocked = f"health check could not run: {error}"[:300]
            if not error.transient:
                escalation.needs_human = True
            return "blocked"
        escalation.check_handle, escalation.check_started_at = result.handle, timezone.now()
        escalation.done_at, escalation.check_passed_at = result.done_at, None
        escalation.has_agent = node.last_seen_at is not None
        escalation.blocked = "health check running"
        _evidence(
            escalation,
            "health_check",
            "started",
            f"{driver.name} driver, handle {result.handle}"
            + (" (the node has an agent)" if escalation.has_agent else ""),
        )
    if escalation.done_at and escalation.done_at > timezone.now():
        return "checking"
    try:
        status = driver.operation_status(escalation.check_handle)
    except DriverError as error:
        escalation.blocked = f"health check status unknown: {error}"[:300]
        return "blocked"
    if status == "running":
        return "checking"
    if status != "succeeded":
        _evidence(escalation, "health_check", "failed", f"handle {escalation.check_handle}")
        return _back_to_failed(escalation, node, f"health check {escalation.check_handle} failed")
    now = timezone.now()
    escalation.check_passed_at = now
    _evidence(escalation, "health_check", "passed", f"handle {escalation.check_handle}", at=now)
    escalation.stage = EscalationStage.VALIDATED
    escalation.blocked = (
        f"waits for {settings.ESCALATION_CLEAN_TELEMETRY_SECONDS} s of clean telemetry"
        if escalation.has_agent
        else ""
    )
    return "validated"


def _clean_telemetry(escalation: NodeEscalation, node: Node) -> str:
    """'' when no hardware fault came since the health check and, where the node has an agent, it reported for
    the window after the check passed; else "waiting", or "failed" when a hardware fault came or the node with an
    agent stayed silent twice the window."""
    window = timedelta(seconds=settings.ESCALATION_CLEAN_TELEMETRY_SECONDS)
    since = escalation.check_passed_at or escalation.check_started_at or timezone.now()
    fault = (
        FaultEvent.objects.filter(
            node=node, detected_at__gte=escalation.check_started_at or since, kind__in=NODE_HARDWARE_KINDS
        )
        .order_by("detected_at")
        .first()
    )
    if fault is not None:
        detail = f"fault {fault.pk} ({fault.kind}) at {fault.detected_at.isoformat()} after the health check"
        _evidence(escalation, "telemetry", "failed", detail)
        return _back_to_failed(escalation, node, detail)
    if not escalation.has_agent:
        return ""
    now = timezone.now()
    seen = node.last_seen_at
    if now >= since + window and seen is not None and seen >= since + window:
        _evidence(
            escalation,
            "telemetry",
            "clean",
            f"reported until {seen.isoformat()}, no hardware fault for {int(window.total_seconds())} s after the check",
        )
        return ""
    if now >= since + 2 * window and (seen is None or seen < since + window):
        detail = f"no telemetry since {seen.isoformat() if seen else 'never'} (health check passed {since.isoformat()})"
        _evidence(escalation, "telemetry", "silent", detail)
        return _back_to_failed(escalation, node, detail)
    escalation.blocked = (
        f"waits for clean telemetry until {(since + window).isoformat()}"
        f" (last report {seen.isoformat() if seen else 'none yet'})"
    )[:300]
    return "waiting"


OUT_OF_SERVICE = (NodeState.CORDONED, NodeState.DRAINING, NodeState.FAILED)


def _cordon_ladders(ladders: list[NodeEscalation]) -> tuple[list[Node], dict[int, ServiceError]]:
    """Cordon the quarantined ladders' nodes (``ladder.node``) in one call, within the fleet's caps: a ladder
    whose cordon is refused says why it waits, the others record the cordon as their step. Returns the nodes as
    they now are and the refusals by node id."""
    now_nodes, refused = node_services.nodes_cordon(
        actor=None,
        nodes=[ladder.node for ladder in ladders],
        reasons={ladder.node_id: f"quarantine: {ladder.reason}" for ladder in ladders},
    )
    for ladder in ladders:
        error = refused.get(ladder.node_id)
        ladder.blocked = f"cordon waits: {error.detail}"[:300] if error else ""
    _node_steps([ladder for ladder in ladders if ladder.node_id not in refused], ActionKind.CORDON)
    return now_nodes, refused


def _quarantined_steps(ladders: list[NodeEscalation], nodes: dict[int, Node]) -> dict[int, str]:
    """The quarantined ladders' step, taken for all of them together: a node not yet out of service is cordoned
    (the fleet's cordon cap may make it wait); a cordoned node none of whose jobs is still being moved off is
    drained (within the drain cap). Each node service is called once for the lot. Returns, per ladder, what
    happened ("blocked" or "draining")."""
    outcome: dict[int, str] = {}
    uncordoned = [ladder for ladder in ladders if nodes[ladder.node_id].state not in OUT_OF_SERVICE]
    if uncordoned:
        now_nodes, refused = _cordon_ladders(uncordoned)
        nodes = nodes | {node.pk: node for node in now_nodes}
        outcome |= {ladder.pk: "blocked" for ladder in uncordoned if ladder.node_id in refused}
    ready = [ladder for ladder in ladders if ladder.pk not in outcome]
    presence = Presence.of([ladder.node_id for ladder in ready])
    for ladder in ready:
        if ladder.node_id in presence.moving:
            jobs = presence.jobs.get(ladder.node_id, [])
            ladder.blocked = f"waits for job(s) {', '.join(map(str, jobs))} to leave the node"[:300]
            outcome[ladder.pk] = "blocked"
    ready = [ladder for ladder in ready if ladder.pk not in outcome]
    if ready:
        _, refused = node_services.nodes_drain(
            actor=None,
            nodes=[nodes[ladder.node_id] for ladder in ready],
            reasons={ladder.node_id: f"drain: {ladder.reason}" for ladder in ready},
        )
        for ladder in ready:
            if ladder.node_id in refused:
                ladder.blocked = f"drain waits: {refused[ladder.node_id].detail}"[:300]
                outcome[ladder.pk] = "blocked"
        drained = [ladder for ladder in ready if ladder.node_id not in refused]
        for ladder, step in zip(drained, _node_steps(drained, ActionKind.DRAIN), strict=True):
            ladder.stage, ladder.blocked, ladder.done_at = EscalationStage.DRAINING, "", step.done_at
            outcome[ladder.pk] = "draining"
    return outcome


def _step(escalation: NodeEscalation, node: Node | None = None) -> str:
    node = node or Node.objects.select_related("cluster__fleet").get(pk=escalation.node_id)
    escalation.node = node
    stage = escalation.stage
    if stage == EscalationStage.QUARANTINED:
        return _quarantined_steps([escalation], {node.pk: node})[escalation.pk]
    if stage == EscalationStage.DRAINING:
        if escalation.remediation == "gpu_reset" and escalation.gpu_index is not None:
            try:
                result = driver_for(node.cluster).reset_gpu(node, escalation.gpu_index)
            except DriverError as error:
                escalation.blocked = f"GPU reset refused: {error}"[:300]
                return "blocked"
            escalation.handle, escalation.done_at = result.handle, result.done_at
            _node_step(escalation, ActionKind.GPU_RESET, handle=result.handle, done_at=result.done_at)
            escalation.stage, escalation.blocked = EscalationStage.REMEDIATING, ""
            return "remediating"
        node_services.node_mark_failed(
            actor=None, node=node, reason=f"needs {escalation.remediation or 'a human'}: {escalation.reason}"
        )
        escalation.stage, escalation.needs_human = EscalationStage.FAILED, True
        escalation.blocked = f"waits for a repair ({escalation.remediation or 'a human'}); then POST repaired"
        return "failed"
    if stage == EscalationStage.REMEDIATING:
        if escalation.done_at and escalation.done_at > timezone.now():
            return "running"
        try:
            status = driver_for(node.cluster).operation_status(escalation.handle)
        except DriverError as error:
            escalation.blocked = f"GPU reset status unknown: {error}"[:300]
            return "blocked"
        if status == "running":
            return "running"
        RecoveryAction.objects.filter(
            handle=escalation.handle, job__isnull=True, state=ActionState.RUNNING
        ).update(
            state=ActionState.SUCCEEDED if status == "succeeded" else ActionState.FAILED,
            ended_at=timezone.now(),
        )
        if status == "succeeded":
            gpus_mark(marks=[(node.pk, escalation.gpu_index, GPUHealth.HEALTHY, "reset")])
            _evidence(escalation, "repaired", "ok", f"GPU {escalation.gpu_index} reset ({escalation.handle})")
            escalation.check_handle, escalation.check_started_at, escalation.check_passed_at = "", None, None
            escalation.stage = EscalationStage.REPAIRED
            return "repaired"
        node_services.node_mark_failed(actor=None, node=node, reason="GPU reset failed")
        escalation.stage, escalation.needs_human = EscalationStage.FAILED, True
        return "failed"
    if stage == EscalationStage.REPAIRED:
        return _health_check(escalation, node)
    if stage == EscalationStage.VALIDATED:
        if waiting := _clean_telemetry(escalation, node):
            return waiting
        # a job parked on the node while it was repaired (its restart waiting for a spare) gets it back
        held = JobAllocation.objects.filter(
            node=node, released_at__isnull=True, job__state__in=(JobState.RUNNING, JobState.RECOVERING)
        ).exists()
        try:
            node_services.node_return_to_service(
                actor=None, node=node, reason="validated by health check", as_spare=not held
            )
        except ServiceError as error:
            escalation.blocked = f"return waits: {error.detail}"[:300]
            return "blocked"
        _node_step(escalation, ActionKind.RETURN_TO_SERVICE)
        spares_returned(node.cluster_id)
        _evidence(escalation, "returned", "ok", "back to its job" if held else "back in the spare pool")
        escalation.stage, escalation.blocked, escalation.needs_human = EscalationStage.RETURNED, "", False
        escalation.strikes = []
        return "returned"
    return "idle"


LADDERS_PER_TRANSACTION = 50
# A step that ends in one of these stages makes the next one possible at once (the drain done, the repair
# checked, the check passed), so beat takes it in the same call; the others wait for something (an operation,
# the clean-telemetry window, a human).
CHAINED_STAGES = (EscalationStage.DRAINING, EscalationStage.REPAIRED, EscalationStage.VALIDATED)
STEPS_PER_BEAT = 4


def escalation_advance(*, cluster_ids: list[int] | None = None) -> int:
    """Move every open ladder on (beat): each takes the steps ready now. Returns how many steps were taken."""
    if provider_automation() == AutomationMode.PAUSED:
        return 0
    now = timezone.now()
    # A ladder waiting for its GPU reset or its health check to end, before the driver said it would, has no step
    # to take: it is not locked and stepped for nothing.
    running = Q(done_at__gt=now) & (
        Q(stage=EscalationStage.REMEDIATING) | (Q(stage=EscalationStage.REPAIRED) & ~Q(check_handle=""))
    )
    rows = (
        NodeEscalation.objects.filter(stage__in=OPEN_STAGES)
        .exclude(running)
        .exclude(node__cluster__automation=AutomationMode.PAUSED)
        .exclude(node__cluster__fleet__automation=AutomationMode.PAUSED)
    )
    if cluster_ids is not None:
        rows = rows.filter(node__cluster_id__in=cluster_ids)
    found = list(rows.order_by("node__cluster_id", "pk").values_list("pk", "node__cluster_id")[:500])
    moved = 0
    for cluster_id in sorted({cluster for _, cluster in found}):
        ids = [pk for pk, cluster in found if cluster == cluster_id]
        for start in range(0, len(ids), LADDERS_PER_TRANSACTION):
            moved += _advance_ladders(cluster_id, ids[start : start + LADDERS_PER_TRANSACTION])
    return moved


LADDER_FIELDS = [field.name for field in NodeEscalation._meta.concrete_fields if not field.primary_key]
_KEPT = [
    field.attname
    for field in NodeEscalation._meta.concrete_fields
    if not field.primary_key and field.name != "updated_at"
]


def _kept(ladder: NodeEscalation) -> tuple:
    """What a step may change on a ladder (a copy: its lists are replaced, not edited, but a copy is sure)."""
    return copy.deepcopy(tuple(getattr(ladder, name) for name in _KEPT))


@transaction.atomic
def _advance_ladders(cluster_id: int, ids: list[int]) -> int:
    """One step for each of these ladders of one cluster, in one transaction: the cluster, then the ladders and
    their nodes (in id order, before any fleet row: as a decision locks them), each ladder stepped in turn; the
    ladders written, audited and published together (one statement each). A ladder another transaction holds is
    left for the next beat."""
    from jobs.placement import lock_cluster, lock_nodes

    lock_cluster(cluster_id)
    ladders = [
        ladder
        for ladder in NodeEscalation.objects.select_for_update(skip_locked=True, no_key=True, of=("self",))
        .select_related("fault")
        .filter(pk__in=ids)
        .order_by("pk")
        if ladder.stage in OPEN_STAGES
    ]
    nodes = lock_nodes([ladder.node_id for ladder in ladders], related=("cluster__fleet",))
    entries, now = [], timezone.now()
    kept = {ladder.pk: _kept(ladder) for ladder in ladders}
    with events.gathered():
        for ladder in ladders:
            ladder.node = nodes[ladder.node_id]
        # The quarantined ladders together (their cordons and drains: one call of each node service), then the
        # rest; then again those whose step made the next one possible now (CHAINED_STAGES), up to
        # STEPS_PER_BEAT steps in all.
        stepping = ladders
        for _ in range(STEPS_PER_BEAT):
            before = {ladder.pk: ladder.stage for ladder in stepping}
            _quarantined_steps(
                [ladder for ladder in stepping if ladder.stage == EscalationStage.QUARANTINED], nodes
            )
            for escalation in stepping:
                if before[escalation.pk] != EscalationStage.QUARANTINED:
                    _step(escalation, nodes[escalation.node_id])
            moved = [ladder for ladder in stepping if ladder.stage != before[ladder.pk]]
            for escalation in moved:
                entries.append(
                    audit_entry(
                        actor=None,
                        action="node.escalation",
                        target=escalation.node,
                        tenant_id=escalation.node.cluster.dedicated_tenant_id,
                        changes={"stage": [before[escalation.pk], escalation.stage]},
                    )
                )
                _publish(escalation, "node.escalation")
            stepping = [ladder for ladder in moved if ladder.stage in CHAINED_STAGES]
            if not stepping:
                break
            # their nodes as the step left them (locked above, in this transaction)
            nodes |= Node.objects.select_related("cluster__fleet").in_bulk(
                [ladder.node_id for ladder in stepping]
            )
        # written when a step changed them (a ladder that waits as it waited is left as it was)
        changed = [ladder for ladder in ladders if _kept(ladder) != kept[ladder.pk]]
        for escalation in changed:
            escalation.updated_at = now
        update_rows(changed, LADDER_FIELDS)
        audit_record_many(entries)
    return len(entries)


@transaction.atomic
def escalation_repaired(*, actor, node: Node, reason: str = "") -> NodeEscalation:
    """An operator repaired a failed node (rebooted, replaced a part): its GPUs and NICs count as healthy
    again, and the ladder goes on to validation (a health check through the driver, then clean telemetry where
    the node has an agent) and the spare pool."""
    escalation = NodeEscalation.objects.select_for_update(no_key=True).filter(node=node).first()
    if escalation is None or escalation.stage != EscalationStage.FAILED:
        raise ServiceError("the node is not waiting for a repair", status=409)
    node_gpus_mark(node_id=node.pk, health=GPUHealth.HEALTHY, reason=reason or "repaired")
    node_nic_links_set(node_id=node.pk, state=LinkState.UP)
    escalation.stage, escalation.blocked, escalation.node = (
        EscalationStage.REPAIRED,
        "waits for its health check",
        node,
    )
    escalation.check_handle, escalation.check_started_at, escalation.check_passed_at = "", None, None
    _evidence(escalation, "repaired", "ok", reason or "marked repaired")
    escalation.save()
    audit_record(
        actor=actor,
        action="node.repaired",
        target=node,
        tenant_id=node.cluster.dedicated_tenant_id,
        changes={"reason": reason},
    )
    _publish(escalation, "node.escalation")
    return escalation


def drain_guard(node: Node) -> tuple[bool, str]:
    """fleet.hooks drain guard: a node may be drained unless a running job there has not been moved yet."""
    jobs = _jobs_still_on(node)
    if not jobs:
        return True, ""
    return False, f"job(s) {', '.join(map(str, jobs[:5]))} still run on {node.hostname}; they are moved first"
