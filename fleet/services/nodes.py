"""Node state changes: cordon, uncordon, drain, fail, return to service — through the cluster's driver.

Fleet-wide caps bound how many nodes may be cordoned or draining at once: absolute counts, and a circuit
breaker as a share of the fleet's nodes (``Fleet.max_disrupted_percent``; at least one node may always be taken
out). A change over a cap is refused with 409 so the caller (an operator, the escalation ladder, a rollout) can
wait and retry, or choose another action.
"""

import math

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import update_rows
from controlplane.errors import ServiceError
from fleet import hooks
from fleet.choices import NodeState
from fleet.drivers import DriverError, driver_for
from fleet.models import Fleet, Node

DISRUPTED = (NodeState.CORDONED, NodeState.DRAINING)


def node_topics(node: Node) -> list[str]:
    return [events.topic("fleet"), events.topic("cluster", node.cluster_id)]


def _publish(node: Node, kind: str, **payload) -> None:
    from fleet.services.publishing import publish_topics

    publish_topics(
        node_topics(node),
        kind,
        {"node": node.pk, "hostname": node.hostname, "state": node.state, **payload},
        url=f"/api/v1/nodes/{node.pk}/",
    )


def share_allowance(fleet: Fleet, total: int) -> int:
    """How many of the fleet's ``total`` nodes the circuit breaker lets be cordoned or draining at once."""
    return max(1, math.floor(total * fleet.max_disrupted_percent / 100))


class _Caps:
    """A fleet's caps on disrupted nodes, counted once and kept current while a batch of nodes changes state."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        counts = Node.objects.filter(cluster__fleet=fleet).aggregate(
            total=Count("pk"),
            disrupted=Count("pk", filter=Q(state__in=DISRUPTED)),
            draining=Count("pk", filter=Q(state=NodeState.DRAINING)),
        )
        self.total, self.disrupted, self.draining = counts["total"], counts["disrupted"], counts["draining"]

    def refusal(self, node: Node, new_state: str) -> str:
        """Why moving ``node`` to ``new_state`` would break a cap ('' when it would not); counts the others."""
        fleet = self.fleet
        others = self.disrupted - (node.state in DISRUPTED)
        if new_state in DISRUPTED and node.state not in DISRUPTED:
            allowed = share_allowance(fleet, self.total)
            if others + 1 > allowed:
                return (
                    f"circuit breaker: fleet {fleet.name} already has {others} of {self.total} nodes cordoned "
                    f"or draining ({fleet.max_disrupted_percent} % allows {allowed})"
                )
        if new_state == NodeState.CORDONED and others >= fleet.max_cordoned_nodes:
            return f"fleet {fleet.name} already has {others} nodes cordoned or draining (cap {fleet.max_cordoned_nodes})"
        draining = self.draining - (node.state == NodeState.DRAINING)
        if new_state == NodeState.DRAINING and draining >= fleet.max_draining_nodes:
            return (
                f"fleet {fleet.name} already has {draining} nodes draining (cap {fleet.max_draining_nodes})"
            )
        return ""

    def moved(self, old: str, new: str) -> None:
        self.disrupted += (new in DISRUPTED) - (old in DISRUPTED)
        self.draining += (new == NodeState.DRAINING) - (old == NodeState.DRAINING)


def _set_states(
    *, actor, nodes: list[Node], state: str, reasons: dict[int, str], action: str, call
) -> tuple[list[Node], dict[int, ServiceError]]:
    """Move these nodes to ``state`` together, one at a time within the fleet's caps and through the driver (a
    node already there is left as it is); returns the nodes as they now are, and why each node refused was refused.
    One lock, one count per fleet, one write, one audit statement, whatever the number of nodes."""
    # The nodes' own rows only: FOR UPDATE on their cluster too would wait on (and deadlock with) a fault report
    # holding the cluster's key-share lock while it waits for one of these nodes.
    locked = list(
        Node.objects.select_for_update(of=("self",))
        .select_related("cluster__fleet")
        .filter(pk__in={node.pk for node in nodes})
        .order_by("pk")
    )
    if len(locked) != len({node.pk for node in nodes}):
        raise Node.DoesNotExist("a node to change is gone")
    caps: dict[int, _Caps] = {}
    if state in DISRUPTED:
        # The fleet's caps count the fleet's disrupted nodes: one cordon or drain of the fleet at a time.
        fleet_ids = sorted({node.cluster.fleet_id for node in locked if node.state != state})
        list(
            Fleet.objects.select_for_update(no_key=True)
            .filter(pk__in=fleet_ids)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
    refused: dict[int, ServiceError] = {}
    changed, entries, now = [], [], timezone.now()
    for node in locked:
        if node.state == state:
            continue
        cap = None
        if state in DISRUPTED:  # only cordoning and draining are capped: nothing to count for the rest
            fleet = node.cluster.fleet
            cap = caps.get(fleet.pk)
            if cap is None:
                cap = caps[fleet.pk] = _Caps(fleet)
            why = cap.refusal(node, state)
            if why:
                refused[node.pk] = ServiceError(why, status=409)
                continue
        try:
            call(driver_for(node.cluster), node)
        except DriverError as error:
            refused[node.pk] = ServiceError(
                f"the cluster refused: {error}", status=409 if not error.transient else 503
            )
            continue
        old, reason = node.state, reasons[node.pk]
        if cap is not None:
            cap.moved(old, state)
        node.state, node.state_reason, node.state_changed_at = state, reason[:300], now
        changed.append((node, old, reason))
        entries.append(
            audit_entry(
                actor=actor,
                action=action,
                target=node,
                tenant_id=node.cluster.dedicated_tenant_id,
                changes={"state": [old, state], "reason": reason},
            )
        )
    update_rows([node for node, _, _ in changed], ["state", "state_reason", "state_changed_at"])
    audit_record_many(entries)
    for node, old, reason in changed:
        _publish(node, f"node.{state}", previous=old, reason=reason)
    if state == NodeState.DRAINING and changed:
        # A drain moves the node's jobs off it (jobs.services.drain), once the drain is stored.
        drained = [node.pk for node, _, _ in changed]
        transaction.on_commit(lambda: hooks.drain_started(drained))
    return locked, refused


def _set_state(*, actor, node: Node, state: str, reason: str, action: str, call) -> Node:
    (node,), refused = _set_states(
        actor=actor, nodes=[node], state=state, reasons={node.pk: reason}, action=action, call=call
    )
    if node.pk in refused:
        raise refused[node.pk]
    return node


@transaction.atomic
def nodes_cordon(
    *, actor, nodes: list[Node], reasons: dict[int, str]
) -> tuple[list[Node], dict[int, ServiceError]]:
    """Cordon many nodes at once (a decision quarantining a leaf's nodes), each within the fleet's cordon cap as
    ``node_cordon`` would; returns the nodes as they now are, and why each node refused was refused."""
    return _set_states(
        actor=actor,
        nodes=nodes,
        state=NodeState.CORDONED,
        action="node.cordon",
        reasons={node.pk: reasons.get(node.pk) or "cordoned" for node in nodes},
        call=lambda driver, n: driver.cordon(n),
    )


@transaction.atomic
def nodes_drain(
    *, actor, nodes: list[Node], reasons: dict[int, str]
) -> tuple[list[Node], dict[int, ServiceError]]:
    """Drain many nodes at once, each within the fleet's drain cap as ``node_drain`` would."""
    return _set_states(
        actor=actor,
        nodes=nodes,
        state=NodeState.DRAINING,
        action="node.drain",
        reasons={node.pk: reasons.get(node.pk) or "draining" for node in nodes},
        call=lambda driver, n: driver.drain(n),
    )


@transaction.atomic
def node_cordon(*, actor, node: Node, reason: str = "") -> Node:
    """Mark unschedulable (quarantine). Within the fleet's cordon cap."""
    return _set_state(
        actor=actor,
        node=node,
        state=NodeState.CORDONED,
        reason=reason or "cordoned",
        action="node.cordon",
        call=lambda driver, n: driver.cordon(n),
    )


@transaction.atomic
def node_drain(*, actor, node: Node, reason: str = "") -> Node:
    """Cordon and evict workloads. Within the fleet's drain cap."""
    return _set_state(
        actor=actor,
        node=node,
        state=NodeState.DRAINING,
        reason=reason or "draining",
        action="node.drain",
        call=lambda driver, n: driver.drain(n),
    )


@transaction.atomic
def node_uncordon(*, actor, node: Node, reason: str = "") -> Node:
    return _set_state(
        actor=actor,
        node=node,
        state=NodeState.READY,
        reason=reason or "uncordoned",
        action="node.uncordon",
        call=lambda driver, n: driver.uncordon(n),
    )


@transaction.atomic
def node_mark_failed(*, actor, node: Node, reason: str) -> Node:
    """Record that a node failed (no driver call: it is already out)."""
    return _set_state(
        actor=actor,
        node=node,
        state=NodeState.FAILED,
        reason=reason,
        action="node.fail",
        call=lambda driver, n: None,
    )


@transaction.atomic
def node_return_to_service(*, actor, node: Node, reason: str = "", as_spare: bool = True) -> Node:
    """A repaired, validated node goes back to the spare pool (or to ready)."""
    state = NodeState.SPARE if as_spare else NodeState.READY
    return _set_state(
        actor=actor,
        node=node,
        state=state,
        reason=reason or "returned to service",
        action="node.return_to_service",
        call=lambda driver, n: driver.uncordon(n),
    )
