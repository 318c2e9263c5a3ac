"""POST /api/v1/faults/ names its node by id or by hostname; a hostname several clusters have needs its cluster."""

import pytest

from jobs.models import FaultEvent
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes():
    east, west = make_cluster(name="east"), make_cluster(name="west")
    return {
        "only": make_node(east, "gpu-only-01"),
        "east": make_node(east, "gpu-07"),
        "west": make_node(west, "gpu-07"),
    }


@pytest.mark.parametrize(
    "naming",
    [
        {"node": "gpu-only-01"},
        {"hostname": "gpu-only-01"},
        {"hostname": "gpu-only-01", "cluster": "east"},
    ],
)
def test_a_fault_names_its_node_by_hostname(api, users, nodes, naming):
    answer = api.as_token(users["operator"]).post(
        "/api/v1/faults/", {**naming, "kind": "thermal"}, format="json"
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["node"] == nodes["only"].pk and answer.json()["hostname"] == "gpu-only-01"
    assert FaultEvent.objects.get().node == nodes["only"]


@pytest.mark.parametrize("node", ["id", "digits"])
def test_a_node_id_still_names_it(api, users, nodes, node):
    value = nodes["west"].pk if node == "id" else str(nodes["west"].pk)
    answer = api.as_token(users["operator"]).post(
        "/api/v1/faults/", {"node": value, "kind": "thermal"}, format="json"
    )
    assert answer.status_code == 201 and answer.json()["node"] == nodes["west"].pk, answer.content


def test_a_hostname_on_two_clusters_is_400_asking_for_the_cluster_or_id(api, users, nodes):
    api.as_token(users["operator"])
    for naming, field in (({"node": "gpu-07"}, "node"), ({"hostname": "gpu-07"}, "hostname")):
        answer = api.post("/api/v1/faults/", {**naming, "kind": "thermal"}, format="json")
        assert answer.status_code == 400, answer.content
        message = answer.json()[field][0]
        assert "east" in message and "west" in message and "cluster" in message and "id" in message
    assert not FaultEvent.objects.exists()
    for cluster in ("west", nodes["west"].cluster_id):
        answer = api.post(
            "/api/v1/faults/",
            {"hostname": "gpu-07", "cluster": cluster, "kind": "nic_down", "nic_name": "mlx5_0"},
            format="json",
        )
        assert answer.status_code in (200, 201) and answer.json()["node"] == nodes["west"].pk, answer.content


@pytest.mark.parametrize(
    "body, field",
    [
        ({"hostname": "no-such-host"}, "hostname"),
        ({"node": "no-such-host"}, "node"),
        ({"hostname": "gpu-07", "cluster": "north"}, "hostname"),
        ({"node": 10**9}, "node"),
        ({"node": 0}, "node"),
        ({"node": True}, "node"),
        ({"node": ["gpu-07"]}, "node"),
        ({"node": ""}, "node"),
        ({"node": "x" * 101}, "node"),
        ({"node": 2**64}, "node"),
        ({"node": "gpu-07", "hostname": "gpu-07"}, "hostname"),
        ({}, "node"),
    ],
)
def test_a_node_that_cannot_be_found_is_400_naming_the_field(api, users, nodes, body, field):
    answer = api.as_token(users["operator"]).post(
        "/api/v1/faults/", {**body, "kind": "thermal"}, format="json"
    )
    assert answer.status_code == 400 and field in answer.json(), answer.content
    assert not FaultEvent.objects.exists()


def test_a_tenant_still_may_not_report(api, users, nodes):
    answer = api.as_token(users["tenant-admin"]).post(
        "/api/v1/faults/", {"hostname": "gpu-only-01", "kind": "thermal"}, format="json"
    )
    assert answer.status_code == 403
