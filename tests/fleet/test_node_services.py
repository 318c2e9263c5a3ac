import pytest

from controlplane.errors import ServiceError
from controlplane.models import AuditEntry, Event
from fleet.choices import NodeState
from fleet.services.nodes import node_cordon, node_drain, node_uncordon
from tests.fleet_factories import make_cluster, make_fleet, make_node

pytestmark = pytest.mark.django_db


def test_cordon_audits_publishes_and_is_idempotent(users):
    cluster = make_cluster()
    node = make_node(cluster)
    actor = users["operator"]
    node_cordon(actor=actor, node=node, reason="xid 79")
    node_cordon(actor=actor, node=node, reason="again")
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED and node.state_reason == "xid 79"
    assert AuditEntry.objects.filter(action="node.cordon").count() == 1
    assert set(Event.objects.filter(kind="node.cordoned").values_list("topic", flat=True)) == {"fleet", f"cluster-{cluster.pk}"}
    node_uncordon(actor=actor, node=node)
    node.refresh_from_db()
    assert node.state == NodeState.READY


def test_fleet_caps_bound_cordons_and_drains(users):
    fleet = make_fleet(max_cordoned_nodes=2, max_draining_nodes=1)
    cluster = make_cluster(fleet)
    nodes = [make_node(cluster) for _ in range(3)]
    actor = users["operator"]
    node_drain(actor=actor, node=nodes[0])
    with pytest.raises(ServiceError) as refused:
        node_drain(actor=actor, node=nodes[1])
    assert refused.value.status == 409
    node_cordon(actor=actor, node=nodes[1])
    with pytest.raises(ServiceError):
        node_cordon(actor=actor, node=nodes[2])
    assert node_states(cluster) == {NodeState.DRAINING: 1, NodeState.CORDONED: 1, NodeState.READY: 1}


def test_unreachable_cluster_refuses_without_changing_state(users):
    cluster = make_cluster(connection={"unreachable": True})
    node = make_node(cluster)
    with pytest.raises(ServiceError) as refused:
        node_cordon(actor=users["operator"], node=node)
    assert refused.value.status == 503
    node.refresh_from_db()
    assert node.state == NodeState.READY and not AuditEntry.objects.filter(action="node.cordon").exists()


def node_states(cluster):
    from collections import Counter

    return dict(Counter(cluster.nodes.values_list("state", flat=True)))
