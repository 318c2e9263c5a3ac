import pytest

from controlplane.errors import ServiceError
from controlplane.models import AuditEntry, Event
from fleet.choices import NodeState
from fleet.services.nodes import node_cordon, node_drain, node_uncordon
from tests.support.factories import make_cluster, make_fleet, make_node

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
    assert set(Event.objects.filter(kind="node.cordoned").values_list("topic", flat=True)) == {
        "fleet",
        f"cluster-{cluster.pk}",
    }
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


def test_share_circuit_breaker_refuses_over_its_share_of_the_fleet(users):
    fleet = make_fleet(max_disrupted_percent=20)  # 10 nodes: two may be cordoned or draining at once
    clusters = [make_cluster(fleet), make_cluster(fleet)]
    nodes = [make_node(clusters[i % 2]) for i in range(10)]
    actor = users["operator"]
    node_cordon(actor=actor, node=nodes[0])
    node_drain(actor=actor, node=nodes[1])  # the other cluster: the share is the fleet's
    with pytest.raises(ServiceError) as refused:
        node_cordon(actor=actor, node=nodes[2])
    assert (
        refused.value.status == 409
        and "circuit breaker" in refused.value.detail
        and "2 of 10" in refused.value.detail
    )
    nodes[2].refresh_from_db()
    assert nodes[2].state == NodeState.READY
    assert AuditEntry.objects.filter(action="node.cordon").count() == 1
    node_drain(actor=actor, node=nodes[0])  # cordoned → draining takes nothing more out
    node_uncordon(actor=actor, node=nodes[1])  # room again
    node_cordon(actor=actor, node=nodes[2])
    out = [
        n.pk
        for n in type(nodes[0]).objects.filter(
            cluster__fleet=fleet, state__in=(NodeState.CORDONED, NodeState.DRAINING)
        )
    ]
    assert sorted(out) == sorted([nodes[0].pk, nodes[2].pk])


def test_share_circuit_breaker_lets_one_node_out_of_a_small_fleet(users):
    fleet = make_fleet(max_disrupted_percent=10)  # 3 nodes: 10 % is 0.3 of a node, but one may always go
    cluster = make_cluster(fleet)
    nodes = [make_node(cluster) for _ in range(3)]
    node_cordon(actor=users["operator"], node=nodes[0])
    with pytest.raises(ServiceError):
        node_cordon(actor=users["operator"], node=nodes[1])


def test_fleet_share_setting_is_validated_through_the_api(users):
    from rest_framework.test import APIClient

    from tests.support.factories import token_header

    fleet = make_fleet()
    client = APIClient()
    client.credentials(**token_header(users["operator"]))
    for bad in (0, 101, "many"):
        answer = client.patch(f"/api/v1/fleets/{fleet.pk}/", {"max_disrupted_percent": bad}, format="json")
        assert answer.status_code == 400 and "max_disrupted_percent" in answer.json()
    answer = client.patch(f"/api/v1/fleets/{fleet.pk}/", {"max_disrupted_percent": 15}, format="json")
    assert answer.status_code == 200 and answer.json()["max_disrupted_percent"] == 15
    assert AuditEntry.objects.filter(action="fleet.update", changes__max_disrupted_percent=[100, 15]).exists()


def test_many_nodes_change_together_within_the_same_caps_as_one_at_a_time(users):
    """A batch (a decision quarantining a leaf, a beat draining the ladders) counts the fleet once and keeps the
    count as it goes: the caps admit exactly as many as one call per node would, in node order, and say why the
    rest wait; one audit statement and one event per node changed."""
    from fleet.services.nodes import nodes_cordon, nodes_drain

    fleet = make_fleet(max_cordoned_nodes=3, max_draining_nodes=1)
    cluster = make_cluster(fleet)
    nodes = [make_node(cluster) for _ in range(5)]
    now, refused = nodes_cordon(actor=None, nodes=nodes, reasons={nodes[0].pk: "leaf down"})
    assert [n.state for n in now] == [NodeState.CORDONED] * 3 + [NodeState.READY] * 2
    assert set(refused) == {nodes[3].pk, nodes[4].pk}
    assert all(
        e.status == 409 and "already has 3 nodes cordoned or draining (cap 3)" in e.detail
        for e in refused.values()
    )
    assert node_states(cluster) == {NodeState.CORDONED: 3, NodeState.READY: 2}
    assert cluster.nodes.get(pk=nodes[0].pk).state_reason == "leaf down"
    assert AuditEntry.objects.filter(action="node.cordon").count() == 3
    assert Event.objects.filter(kind="node.cordoned", topic="fleet").count() == 3
    # the cordoned three: one may drain (the drain cap); cordoned → draining takes nothing more out of the fleet
    _, refused = nodes_drain(actor=None, nodes=nodes[:3], reasons={})
    assert set(refused) == {nodes[1].pk, nodes[2].pk}
    assert "already has 1 nodes draining (cap 1)" in refused[nodes[1].pk].detail
    assert node_states(cluster) == {NodeState.DRAINING: 1, NodeState.CORDONED: 2, NodeState.READY: 2}
    # a node already in the state is left as it is, and counts as itself, not as another
    _, refused = nodes_cordon(actor=None, nodes=nodes[1:3], reasons={})
    assert refused == {} and AuditEntry.objects.filter(action="node.cordon").count() == 3
