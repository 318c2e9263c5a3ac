"""A node's taints, set through the cluster's driver."""

from django.db import transaction

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.drivers import DriverError, driver_for
from fleet.models import Node
from fleet.services.nodes import _publish

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def clean_taints(taints) -> list[dict]:
    if not isinstance(taints, list):
        raise ServiceError("a list of {key, value, effect}", field="taints")
    cleaned = []
    for i, taint in enumerate(taints):
        if not isinstance(taint, dict) or set(taint) - {"key", "value", "effect"}:
            raise ServiceError("a mapping with key, value and effect", field=f"taints[{i}]")
        if not isinstance(taint.get("key"), str) or not 0 < len(taint["key"]) <= 253:
            raise ServiceError("a taint key", field=f"taints[{i}].key")
        if not isinstance(taint.get("value", ""), str) or len(taint.get("value", "")) > 63:
            raise ServiceError("a string of at most 63 characters", field=f"taints[{i}].value")
        if taint.get("effect") not in EFFECTS:
            raise ServiceError(f"one of {', '.join(EFFECTS)}", field=f"taints[{i}].effect")
        cleaned.append({"key": taint["key"], "value": taint.get("value", ""), "effect": taint["effect"]})
    return cleaned


@transaction.atomic
def node_set_taints(*, actor, node: Node, taints) -> Node:
    """Replace the node's Lockstep-managed taints: the added ones are applied through the driver."""
    taints = clean_taints(taints)
    node = Node.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=node.pk)
    added = [t for t in taints if t not in node.taints]
    driver = driver_for(node.cluster)
    try:
        for taint in added:
            driver.taint(node, taint["key"], taint["value"], taint["effect"])
    except DriverError as error:
        raise ServiceError(f"the cluster refused: {error}", status=503 if error.transient else 409) from error
    old, node.taints = node.taints, taints
    node.save(update_fields=["taints"])
    audit_record(
        actor=actor,
        action="node.taint",
        target=node,
        tenant_id=node.cluster.dedicated_tenant_id,
        changes={"taints": [old, taints]},
    )
    _publish(node, "node.tainted", taints=taints)
    return node
