"""A drain, once committed, sets its node's jobs moving (fleet.hooks.drain_started: jobs.services.drain queues the
node's drain request); a refused drain, or a node already draining, sets nothing in motion."""

import pytest

from controlplane.errors import ServiceError
from fleet.services.nodes import node_cordon, node_drain, nodes_drain
from jobs.services import drain
from tests.support.factories import make_cluster, make_fleet, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):
    """What the drain hook queues, instead of sending it to the broker: (task name, node ids)."""
    sent = []
    monkeypatch.setattr(
        "controlplane.queueing.queue", lambda task, *args: sent.append((task.name, *args)) or True
    )
    return sent


def test_a_drain_queues_its_node_s_request_after_commit(users, queued, django_capture_on_commit_callbacks):
    node = make_node(make_cluster())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        node_drain(actor=users["operator"], node=node, reason="maintenance")
    assert queued == []  # nothing before COMMIT
    for callback in callbacks:
        callback()
    assert queued == [("jobs.drain_request", [node.pk])]


def test_the_bulk_drain_queues_the_nodes_it_drained_and_no_other(
    users, queued, django_capture_on_commit_callbacks
):
    fleet = make_fleet(max_draining_nodes=2)
    cluster = make_cluster(fleet)
    nodes = [make_node(cluster) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        _, refused = nodes_drain(actor=None, nodes=nodes, reasons={})
    assert list(refused) == [nodes[2].pk]  # over the fleet's drain cap
    assert queued == [("jobs.drain_request", [nodes[0].pk, nodes[1].pk])]
    with django_capture_on_commit_callbacks(execute=True):
        nodes_drain(actor=None, nodes=nodes[:2], reasons={})  # already draining: nothing new
        node_cordon(actor=None, node=nodes[2])
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ServiceError):
        node_drain(actor=None, node=nodes[2])  # still over the cap
    assert queued == [("jobs.drain_request", [nodes[0].pk, nodes[1].pk])]


def test_the_hook_is_the_jobs_app_s():
    from fleet import hooks

    assert hooks._drain_started is drain.drain_started
