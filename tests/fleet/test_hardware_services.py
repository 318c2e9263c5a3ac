from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet.choices import GPUHealth, LinkState
from fleet.models import GPU, NIC, Node
from fleet.services import hardware
from fleet.services.hardware import (
    gpus_mark,
    nic_links_set,
    node_cool_down,
    node_gpus_mark,
    node_nic_links_set,
    nodes_mark_seen,
    nodes_mark_seen_sql,
    nodes_set_risk,
)
from tests.support.factories import make_cluster, make_fleet
from tests.support.jobs import bulk_nodes

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["postgresql", "portable"])
def vendor(request, monkeypatch):
    """The batch writes run both ways: PostgreSQL's arrays, and the ORM's that SQLite (local runs) takes."""
    if request.param == "portable":
        monkeypatch.setattr(hardware, "connection", _Portable())
    return request.param


class _Portable:
    vendor = "sqlite"


@pytest.fixture
def nodes():
    return bulk_nodes(make_cluster(make_fleet()), 6, gpus=4, nics=2)


def health(node) -> dict[int, tuple[str, str]]:
    return {g.index: (g.health, g.health_reason) for g in GPU.objects.filter(node=node)}


def links(node) -> dict[str, str]:
    return dict(NIC.objects.filter(node=node).values_list("name", "link_state"))


def test_gpus_mark_writes_the_listed_gpus_in_one_statement(vendor, nodes, django_assert_max_num_queries):
    marks = [
        (node.pk, index, GPUHealth.FAILED, f"xid 79 on {node.hostname}/{index}")
        for node in nodes[:4]
        for index in (0, 2)
    ]
    marks.append((nodes[4].pk, 1, GPUHealth.DEGRADED, "row remap pending"))
    with django_assert_max_num_queries(1 if vendor == "postgresql" else len(marks)):
        assert gpus_mark(marks=marks) == 9
    for node in nodes[:4]:
        assert health(node) == {
            0: ("failed", f"xid 79 on {node.hostname}/0"),
            1: ("healthy", ""),
            2: ("failed", f"xid 79 on {node.hostname}/2"),
            3: ("healthy", ""),
        }
    assert health(nodes[4])[1] == ("degraded", "row remap pending")
    assert set(health(nodes[5]).values()) == {("healthy", "")}


def test_gpus_mark_shares_one_update_per_health_and_reason_without_postgresql(
    nodes, monkeypatch, django_assert_num_queries
):
    monkeypatch.setattr(hardware, "connection", _Portable())
    marks = [(node.pk, index, GPUHealth.FAILED, "rack power loss") for node in nodes for index in range(4)]
    with django_assert_num_queries(1):
        assert gpus_mark(marks=marks) == 24
    assert GPU.objects.filter(node__in=nodes, health="failed", health_reason="rack power loss").count() == 24


def test_gpus_mark_cuts_the_reason_keeps_the_last_mark_and_skips_unknown_gpus(vendor, nodes):
    node = nodes[0]
    written = gpus_mark(
        marks=[
            (node.pk, 0, GPUHealth.FAILED, "x" * 500),
            (node.pk, 1, GPUHealth.FAILED, "first"),
            (node.pk, 1, GPUHealth.HEALTHY, "second"),
            (node.pk, 9, GPUHealth.FAILED, "no such GPU"),
            (0, 0, GPUHealth.FAILED, "no such node"),
        ]
    )
    assert written == 2
    assert health(node)[0] == ("failed", "x" * 300)
    assert health(node)[1] == ("healthy", "second")
    assert gpus_mark(marks=[]) == 0


def test_gpus_mark_refuses_an_unknown_health(nodes):
    with pytest.raises(ValueError):
        gpus_mark(marks=[(nodes[0].pk, 0, "melted", "")])
    assert set(health(nodes[0]).values()) == {("healthy", "")}


def test_node_gpus_mark_writes_every_gpu_of_the_node_only(nodes, django_assert_num_queries):
    gpus_mark(
        marks=[(nodes[0].pk, 0, GPUHealth.FAILED, "xid 48"), (nodes[1].pk, 0, GPUHealth.FAILED, "xid 48")]
    )
    with django_assert_num_queries(1):
        assert (
            node_gpus_mark(node_id=nodes[0].pk, health=GPUHealth.HEALTHY, reason="repaired " + "y" * 400) == 4
        )
    assert set(health(nodes[0]).values()) == {("healthy", ("repaired " + "y" * 400)[:300])}
    assert health(nodes[1])[0] == ("failed", "xid 48")


def test_nic_links_set_writes_the_listed_links_in_one_statement(vendor, nodes, django_assert_num_queries):
    pairs = [(node.pk, "mlx5_1") for node in nodes[:5]] + [(nodes[0].pk, "mlx5_1"), (nodes[5].pk, "ib9")]
    with django_assert_num_queries(1):
        assert nic_links_set(links=pairs, state=LinkState.DOWN) == 5
    for node in nodes[:5]:
        assert links(node) == {"mlx5_0": "up", "mlx5_1": "down"}
    assert links(nodes[5]) == {"mlx5_0": "up", "mlx5_1": "up"}
    with django_assert_num_queries(0):
        assert nic_links_set(links=[], state=LinkState.DOWN) == 0
    with pytest.raises(ValueError):
        nic_links_set(links=pairs, state="flapping")


def test_node_nic_links_set_writes_every_link_of_the_node_only(nodes, django_assert_num_queries):
    nic_links_set(links=[(nodes[0].pk, "mlx5_0"), (nodes[1].pk, "mlx5_0")], state=LinkState.DEGRADED)
    with django_assert_num_queries(1):
        assert node_nic_links_set(node_id=nodes[0].pk, state=LinkState.UP) == 2
    assert links(nodes[0]) == {"mlx5_0": "up", "mlx5_1": "up"}
    assert links(nodes[1])["mlx5_0"] == "degraded"


def test_node_cool_down_sets_the_end_from_now(nodes, django_assert_num_queries):
    before = timezone.now()
    with django_assert_num_queries(1):
        until = node_cool_down(node_id=nodes[0].pk, seconds=600)
    nodes[0].refresh_from_db()
    assert nodes[0].cooldown_until == until and before + timedelta(
        seconds=600
    ) <= until <= timezone.now() + timedelta(seconds=600)
    # A shorter cooldown later replaces a longer one, as placement.cool_down did: it is set, not extended.
    shorter = node_cool_down(node_id=nodes[0].pk, seconds=5)
    nodes[0].refresh_from_db()
    assert nodes[0].cooldown_until == shorter < until
    assert Node.objects.filter(pk__in=[n.pk for n in nodes[1:]], cooldown_until__isnull=False).count() == 0


def test_nodes_mark_seen_sets_the_time_of_the_named_nodes_in_one_statement(
    vendor, nodes, django_assert_num_queries
):
    at = timezone.now()
    with django_assert_num_queries(1):
        assert nodes_mark_seen(node_ids={n.pk for n in nodes[:3]}, at=at) == 3
    seen = dict(Node.objects.filter(pk__in=[n.pk for n in nodes]).values_list("pk", "last_seen_at"))
    assert [seen[n.pk] for n in nodes] == [at, at, at, None, None, None]
    with django_assert_num_queries(0):
        assert nodes_mark_seen(node_ids=set()) == 0


def test_nodes_mark_seen_takes_the_given_time_as_it_always_did(vendor, nodes):
    """The time is set, not compared: telemetry passes the time it took the batch in (now), so a node's time
    moves forward with each batch, a replayed spool's old readings included; it has no guard against an earlier
    time (which no caller passes)."""
    later = timezone.now()
    nodes_mark_seen(node_ids=[nodes[0].pk], at=later)
    nodes_mark_seen(node_ids=[nodes[0].pk], at=later - timedelta(hours=1))
    nodes[0].refresh_from_db()
    assert nodes[0].last_seen_at == later - timedelta(hours=1)
    nodes_mark_seen(node_ids=[nodes[0].pk])
    nodes[0].refresh_from_db()
    assert nodes[0].last_seen_at >= later


def test_nodes_mark_seen_sql_is_the_same_text_for_any_number_of_nodes(nodes):
    at = timezone.now()
    one, params = nodes_mark_seen_sql(node_ids=[nodes[0].pk], at=at)
    many, _ = nodes_mark_seen_sql(node_ids=[n.pk for n in nodes], at=at)
    assert one == many and params == [at, [nodes[0].pk]]
    with connection.cursor() as cursor:
        cursor.execute(many, [at, [n.pk for n in nodes[:2]]])
    assert Node.objects.filter(last_seen_at=at).count() == 2


def test_nodes_set_risk_writes_scores_in_one_statement(nodes, django_assert_num_queries):
    at = timezone.now()
    with django_assert_num_queries(1):
        assert nodes_set_risk(scores={nodes[0].pk: 0.9, nodes[1].pk: 0.25}, at=at) == 2
    rows = dict(
        (pk, (score, when))
        for pk, score, when in Node.objects.filter(pk__in=[n.pk for n in nodes]).values_list(
            "pk", "risk_score", "risk_updated_at"
        )
    )
    assert (
        rows[nodes[0].pk] == (0.9, at)
        and rows[nodes[1].pk] == (0.25, at)
        and rows[nodes[2].pk] == (0.0, None)
    )
    with django_assert_num_queries(0):
        assert nodes_set_risk(scores={}, at=at) == 0
