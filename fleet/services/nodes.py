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
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.choices import NodeState
from fleet.drivers import DriverError, driver_for
from fleet.models import Fleet, Node

DISRUPTED = (NodeState.CORDONED, NodeState.DRAINING)


def node_topics(node: Node) -> list[str]:
    return [events.topic("fleet"), events.topic("cluster", node.cluster_id)]


def _publish(node: Node, kind: str, **payload) -> None:
    from fleet.services.publishing import publish_topics

    publish_topics(node_topics(node), kind, {"node": node.pk, "hostname": node.hostname, "state": node.state, **payload},
                   url=f"/api/v1/nodes/{node.pk}/")


def share_allowance(fleet: Fleet, total: int) -> int:
    """How many of the fleet's ``total`` nodes the circuit breaker lets be cordoned or draining at once."""
    return max(1, math.floor(total * fleet.max_disrupted_percent / 100))


def _check_cap(node: Node, new_state: str) -> None:
    fleet = node.cluster.fleet
    if new_state in DISRUPTED and node.state not in DISRUPTED:
        counts = Node.objects.filter(cluster__fleet=fleet).exclude(pk=node.pk).aggregate(
            total=Count("pk"), disrupted=Count("pk", filter=Q(state__in=DISRUPTED)))
        total, disrupted = counts["total"] + 1, counts["disrupted"]
        allowed = share_allowance(fleet, total)
        if disrupted + 1 > allowed:
            raise ServiceError(f"circuit breaker: fleet {fleet.name} already has {disrupted} of {total} nodes cordoned "
                               f"or draining ({fleet.max_disrupted_percent} % allows {allowed})", status=409)
    if new_state == NodeState.CORDONED:
        count = Node.objects.filter(cluster__fleet=fleet, state__in=DISRUPTED).exclude(pk=node.pk).count()
        if count >= fleet.max_cordoned_nodes:
            raise ServiceError(f"fleet {fleet.name} already has {count} nodes cordoned or draining "
                               f"(cap {fleet.max_cordoned_nodes})", status=409)
    if new_state == NodeState.DRAINING:
        count = Node.objects.filter(cluster__fleet=fleet, state=NodeState.DRAINING).exclude(pk=node.pk).count()
        if count >= fleet.max_draining_nodes:
            raise ServiceError(f"fleet {fleet.name} already has {count} nodes draining (cap {fleet.max_draining_nodes})",
                               status=409)


def _set_state(*, actor, node: Node, state: str, reason: str, action: str, call) -> Node:
    # The node's own row only: FOR UPDATE on its cluster too would wait on (and deadlock with) a fault report
    # holding the cluster's key-share lock while it waits for this node.
    node = Node.objects.select_for_update(of=("self",)).select_related("cluster__fleet").get(pk=node.pk)
    if node.state == state:
        return node
    if state in (NodeState.CORDONED, NodeState.DRAINING):
        # The fleet's caps count the fleet's disrupted nodes: one cordon or drain of the fleet at a time.
        list(Fleet.objects.select_for_update(no_key=True).filter(pk=node.cluster.fleet_id).values_list("pk", flat=True))
    _check_cap(node, state)
    try:
        call(driver_for(node.cluster), node)
    except DriverError as error:
        raise ServiceError(f"the cluster refused: {error}", status=409 if not error.transient else 503) from error
    old = node.state
    node.state = state
    node.state_reason = reason[:300]
    node.state_changed_at = timezone.now()
    node.save(update_fields=["state", "state_reason", "state_changed_at"])
    audit_record(actor=actor, action=action, target=node, tenant_id=node.cluster.dedicated_tenant_id,
                 changes={"state": [old, state], "reason": reason})
    _publish(node, f"node.{state}", previous=old, reason=reason)
    return node


@transaction.atomic
def node_cordon(*, actor, node: Node, reason: str = "") -> Node:
    """Mark unschedulable (quarantine). Within the fleet's cordon cap."""
    return _set_state(actor=actor, node=node, state=NodeState.CORDONED, reason=reason or "cordoned",
                      action="node.cordon", call=lambda driver, n: driver.cordon(n))


@transaction.atomic
def node_drain(*, actor, node: Node, reason: str = "") -> Node:
    """Cordon and evict workloads. Within the fleet's drain cap."""
    return _set_state(actor=actor, node=node, state=NodeState.DRAINING, reason=reason or "draining",
                      action="node.drain", call=lambda driver, n: driver.drain(n))


@transaction.atomic
def node_uncordon(*, actor, node: Node, reason: str = "") -> Node:
    return _set_state(actor=actor, node=node, state=NodeState.READY, reason=reason or "uncordoned",
                      action="node.uncordon", call=lambda driver, n: driver.uncordon(n))


@transaction.atomic
def node_mark_failed(*, actor, node: Node, reason: str) -> Node:
    """Record that a node failed (no driver call: it is already out)."""
    return _set_state(actor=actor, node=node, state=NodeState.FAILED, reason=reason, action="node.fail",
                      call=lambda driver, n: None)


@transaction.atomic
def node_return_to_service(*, actor, node: Node, reason: str = "", as_spare: bool = True) -> Node:
    """A repaired, validated node goes back to the spare pool (or to ready)."""
    state = NodeState.SPARE if as_spare else NodeState.READY
    return _set_state(actor=actor, node=node, state=state, reason=reason or "returned to service",
                      action="node.return_to_service", call=lambda driver, n: driver.uncordon(n))
