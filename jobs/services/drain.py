"""A drained node's jobs move off it through the fault path, and the drain ends when none is left.

A drain (``fleet.services.nodes.node_drain`` or ``nodes_drain``: an operator, a rollout, the escalation ladder)
sets the node draining; once that is committed, a **drain request** is raised for the node: a FaultEvent of kind
``drain`` from source ``lockstep``, one per drain (its idempotency key names the node and when its drain began).
Triage reads it as the node leaving service whole, not as a failure (``jobs.triage``: no hardware is marked, the
node does not climb the ladder), so the cluster's one decision (``jobs.services.recovery.decide``) gives each job
on the node one recovery, the cheapest feasible: a live migration to a spare where the job is protected, a
restart from checkpoint (its workers placed on spares, off the node) where it is not; a job already recovering
folds into its recovery or has it replaced, as for any fault. Beat's ``drains_advance`` then, for each draining
node:

- raises the drain request where none was raised (the message was lost, the worker died);
- completes the drain once no job holds the node (no running or recovering job's allocation there, no recovery
  off it under way): the node is cordoned (nothing on it, nothing new placed there), within the fleet's caps, unless its escalation ladder is open (the ladder takes the
  node on from its drain);
- past DRAIN_DEADLINE_SECONDS from the start of the drain, with jobs still on the node, publishes
  ``node.drain_overdue`` on the fleet's topic, once per drain (the request records it; the notifications follow
  the event).

``drain_waits`` says what a drain waits for: each job still on the node, what holds it there and since when.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.choices import NodeState
from fleet.models import Node
from fleet.services import nodes as node_services
from fleet.services.publishing import publish_topics
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    ActionKind,
    EscalationStage,
    FaultKind,
    FaultSource,
    FaultState,
    JobState,
    Severity,
)
from jobs.models import FaultEvent, JobAllocation, NodeEscalation, RecoveryAction

log = logging.getLogger(__name__)

HOLDING_STATES = (JobState.RUNNING, JobState.RECOVERING)
# The ladder's stages after its drain: the ladder, not the drain, decides what the node becomes.
LADDER_OWNS = (EscalationStage.DRAINING, EscalationStage.REMEDIATING, EscalationStage.FAILED)


def drain_key(node: Node) -> str:
    """The idempotency key of a node's drain request: one per drain (a node drained again gets a new one)."""
    started = node.state_changed_at.isoformat() if node.state_changed_at else ""
    return f"drain:{node.pk}:{started}"


def holding(node_ids) -> dict[int, list[JobAllocation]]:
    """Per node, the allocations that running or recovering jobs still hold there (rank order)."""
    found: dict[int, list[JobAllocation]] = {}
    rows = (
        JobAllocation.objects.filter(
            node_id__in=list(node_ids), released_at__isnull=True, job__state__in=HOLDING_STATES
        )
        .select_related("job")
        .order_by("node_id", "rank_start")
    )
    for allocation in rows:
        found.setdefault(allocation.node_id, []).append(allocation)
    return found


def leaving(node_ids) -> dict[int, dict[int, object]]:
    """Per node, the jobs still held there: by an allocation of a running or recovering job, or by a recovery off
    the node under way (a restart moves its workers as it starts, and has left only once it succeeded), by job id."""
    found: dict[int, dict[int, object]] = {}
    for node_id, allocations in holding(node_ids).items():
        for allocation in allocations:
            found.setdefault(node_id, {}).setdefault(allocation.job_id, allocation.job)
    moving = (
        RecoveryAction.objects.filter(
            node_id__in=list(node_ids), job__isnull=False, dry_run=False, state__in=ACTIVE_ACTION_STATES
        )
        .exclude(kind=ActionKind.NIC_FAILOVER)
        .select_related("job")
        .order_by("planned_at", "pk")
    )
    for action in moving:
        found.setdefault(action.node_id, {}).setdefault(action.job_id, action.job)
    return found


def drain_request(*, node_ids: list[int]) -> list[int]:
    """Raise the drain request of each of these nodes that a drain took out of service (draining, or failed by the
    ladder's next step) while a job still runs there, once per drain; the fault path decides and starts the moves
    (its handling is queued on commit). Returns the ids of the requests raised now."""
    from jobs.services.faults import fault_ingest

    nodes = list(
        Node.objects.filter(pk__in=node_ids, state__in=(NodeState.DRAINING, NodeState.FAILED))
        .select_related("cluster")
        .order_by("pk")
    )
    held = holding([node.pk for node in nodes])
    raised = []
    for node in nodes:
        jobs = sorted({allocation.job_id for allocation in held.get(node.pk, [])})
        key = drain_key(node)
        if not jobs or FaultEvent.objects.filter(idempotency_key=key).exists():
            continue
        try:
            fault, created = fault_ingest(
                source=FaultSource.LOCKSTEP,
                kind=FaultKind.DRAIN,
                node=node,
                severity=Severity.INFO,
                details={"drain": node.state_reason, "jobs": jobs},
                idempotency_key=key,
            )
        except ServiceError as error:  # not expected: logged, and the next sweep tries again
            log.warning("drain request for %s not raised: %s", node.hostname, error.detail)
            continue
        if created:
            raised.append(fault.pk)
    return raised


def _complete(node_ids: list[int]) -> int:
    """Cordon the draining nodes no job holds any more (checked again under their locks); returns how many."""
    with transaction.atomic():
        nodes = list(
            Node.objects.select_for_update(of=("self",))
            .filter(pk__in=node_ids, state=NodeState.DRAINING)
            .order_by("pk")
        )
        held = leaving([node.pk for node in nodes])
        empty = [node for node in nodes if not held.get(node.pk)]
        if not empty:
            return 0
        _, refused = node_services.nodes_cordon(
            actor=None,
            nodes=empty,
            reasons={node.pk: f"drained: no job left on it ({node.state_reason})"[:300] for node in empty},
        )
    for pk, error in refused.items():
        log.info("drained node %s stays draining: %s", pk, error.detail)
    return len(empty) - len(refused)


def _overdue(nodes: list[Node], now: datetime) -> int:
    """Publish ``node.drain_overdue`` for each of these draining nodes with jobs on it past its deadline, once per
    drain (its request's details keep when). Returns how many were published."""
    deadline = timedelta(seconds=settings.DRAIN_DEADLINE_SECONDS)
    late = [node for node in nodes if node.state_changed_at and node.state_changed_at + deadline <= now]
    published = 0
    for node in late:
        with transaction.atomic():
            request = (
                FaultEvent.objects.select_for_update(of=("self",), no_key=True)
                .filter(idempotency_key=drain_key(node))
                .first()
            )
            if request is None or (request.details or {}).get("overdue_at"):
                continue
            status = drain_waits(node, now=now)
            if status is None or not status["waits"]:
                continue
            waits = "; ".join(
                f"job {wait['job'].pk} ({wait['job'].name}): {wait['what']} since {wait['since']:%H:%M:%S} UTC"
                for wait in status["waits"]
            )
            request.details = {**(request.details or {}), "overdue_at": now.isoformat()}
            request.save(update_fields=["details"])
            publish_topics(
                node_services.node_topics(node),
                "node.drain_overdue",
                {
                    "node": node.pk,
                    "hostname": node.hostname,
                    "state": node.state,
                    "since": node.state_changed_at.isoformat(),
                    "deadline_seconds": settings.DRAIN_DEADLINE_SECONDS,
                    "jobs": [wait["job"].pk for wait in status["waits"]],
                    "waits": waits[:1000],
                },
                url=f"/api/v1/nodes/{node.pk}/",
            )
            published += 1
    return published


def drains_advance(*, now: datetime | None = None) -> dict:
    """Beat's step for every draining node: raise a missing drain request, complete a drain no job holds up any
    more, and say once when one is past DRAIN_DEADLINE_SECONDS. Returns counts of each."""
    now = now or timezone.now()
    nodes = list(Node.objects.filter(state=NodeState.DRAINING).select_related("cluster").order_by("pk")[:500])
    held = leaving([node.pk for node in nodes])
    laddered = set(
        NodeEscalation.objects.filter(node__in=nodes, stage__in=LADDER_OWNS).values_list("node_id", flat=True)
    )
    empty = [node.pk for node in nodes if not held.get(node.pk) and node.pk not in laddered]
    busy = [node for node in nodes if held.get(node.pk)]
    return {
        "completed": _complete(empty) if empty else 0,
        "requested": len(drain_request(node_ids=[node.pk for node in busy])) if busy else 0,
        "overdue": _overdue(busy, now) if busy else 0,
    }


def _action_words(action: RecoveryAction) -> str:
    where = f" to {action.to_node.hostname}" if action.to_node_id else ""
    what = f"{action.kind.replace('_', ' ')}{where} (action {action.pk}) {action.state}"
    return f"{what}: {action.error}" if action.error else what


def drain_waits(node: Node, *, now: datetime | None = None) -> dict | None:
    """What a draining node's drain waits for (None when the node is not draining): ``since`` (the drain's
    start), ``deadline``, ``overdue``, ``request`` (its drain request, or None yet) and ``waits``: per job still on
    the node (``leaving``), ``job``, ``what`` holds it there and ``since`` when."""
    if node.state != NodeState.DRAINING:
        return None
    now = now or timezone.now()
    since = node.state_changed_at or now
    deadline = since + timedelta(seconds=settings.DRAIN_DEADLINE_SECONDS)
    jobs = leaving([node.pk]).get(node.pk, {})
    request = FaultEvent.objects.filter(idempotency_key=drain_key(node)).first()
    under_way = {
        action.job_id: action
        for action in RecoveryAction.objects.filter(
            job_id__in=list(jobs), dry_run=False, state__in=ACTIVE_ACTION_STATES
        )
        .exclude(kind=ActionKind.NIC_FAILOVER)
        .select_related("to_node")
        .order_by("planned_at", "pk")
    }
    decided = (
        {a.job_id: a for a in request.actions.order_by("planned_at", "pk")} if request is not None else {}
    )
    waits = []
    for job_id, job in jobs.items():
        action, ended = under_way.get(job_id), decided.get(job_id)
        if action is not None:
            what, at = _action_words(action), action.started_at or action.planned_at
        elif request is None:
            what, at = "not asked to move yet: beat raises the drain request", since
        elif request.state == FaultState.NEW:
            why = request.state_reason or "waits for the fault handler"
            what, at = f"its drain request (fault {request.pk}) is not decided: {why}", request.received_at
        elif ended is not None and ended.dry_run:
            what = f"dry run: {ended.kind.replace('_', ' ')} was decided, not carried out"
            at = ended.planned_at
        elif ended is not None:
            what, at = _action_words(ended), ended.ended_at or ended.planned_at
        else:
            what = f"no move decided for it: {request.state_reason or 'nothing to do'}"
            at = request.handled_at or request.received_at
        waits.append({"job": job, "what": what[:400], "since": at})
    return {
        "since": since,
        "deadline": deadline,
        "overdue": bool(waits) and now >= deadline,
        "request": request,
        "waits": waits,
    }


def drain_started(node_ids: list[int]) -> None:
    """fleet.hooks: these nodes were just set draining (committed): queue their drain requests. A message lost
    here is made good by beat's ``drains_advance``."""
    from controlplane.queueing import queue
    from jobs.tasks import drain_request_task

    queue(drain_request_task, sorted(node_ids))
