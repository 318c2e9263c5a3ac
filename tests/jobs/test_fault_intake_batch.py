"""Issue 26: a batch of reports stored together gives what storing them one by one gives; a cluster's handling is
queued once while it waits, and a fault stored after a handler began gathering gets a handling of its own."""

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.models import AuditEntry, Event
from jobs.choices import FaultState
from jobs.models import FaultEvent, Incident
from jobs.services.faults import FaultReport, fault_handle, fault_ingest, fault_ingest_many
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

INCIDENT_FIELDS = ("scope", "nic_name", "kind", "xid", "fatal", "rank", "state", "report_count")


def _incident(node) -> dict:
    [row] = Incident.objects.filter(node=node).values(*INCIDENT_FIELDS)
    return row


def _faults(node) -> list[tuple]:
    return list(
        FaultEvent.objects.filter(node=node)
        .order_by("pk")
        .values_list("kind", "nic_name", "gpu_index", "xid", "sources", "report_count", "state")
    )


MIXES = {
    "eight NICs down": [dict(kind="nic_down", nic_name=f"mlx5_{i}") for i in range(8)],
    "one NIC twice": [dict(kind="nic_down", nic_name="mlx5_1"), dict(kind="nic_down", nic_name="mlx5_1")],
    "a NIC, then the GPU falls off the bus": [
        dict(kind="nic_down", nic_name="mlx5_2"),
        dict(kind="gpu_xid", gpu_index=0, xid=79),
        dict(kind="nic_down", nic_name="mlx5_3"),
    ],
}


@pytest.mark.django_db
@pytest.mark.parametrize("mix", list(MIXES))
def test_a_batch_stores_what_one_by_one_stores(tenant_a, mix):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    one, other = (node_of(submit(cluster, tenant_a, gpus=8)) for _ in range(2))
    one_by_one = [fault_ingest(source="agent", node=one, **report)[1] for report in MIXES[mix]]
    events_before = Event.objects.count()
    stored = fault_ingest_many(
        source="agent", reports=[FaultReport(node=other, **report) for report in MIXES[mix]]
    )
    assert [created for _, created in stored] == one_by_one
    assert _faults(other) == _faults(one)
    assert _incident(other) == _incident(one)
    assert {fault.incident_id for fault, _ in stored} == {Incident.objects.get(node=other).pk}
    new = len(_faults(other))
    assert (
        AuditEntry.objects.filter(action="fault.ingest", object_id__in=[str(f.pk) for f, _ in stored]).count()
        == new
    )
    # one fault.reported per new fault, on the cluster's, the fleet's, the job's and its tenant's topics
    assert Event.objects.count() - events_before == 4 * new


@pytest.mark.django_db
def test_a_batch_joins_faults_and_incidents_already_open(tenant_a):
    cluster = protected_cluster(nodes=1, spares=0, connection=INSTANT)
    node = node_of(submit(cluster, tenant_a, gpus=8))
    first, _ = fault_ingest(source="alertmanager", kind="nic_down", node=node, nic_name="mlx5_0")
    stored = fault_ingest_many(
        source="agent",
        reports=[
            FaultReport(kind="nic_down", node=node, nic_name="mlx5_0"),
            FaultReport(kind="node_unreachable", node=node),
        ],
    )
    assert stored[0] == (first, False) and stored[0][0].sources == ["alertmanager", "agent"]
    assert stored[1][1] and stored[1][0].incident_id == first.incident_id
    incident = Incident.objects.get(pk=first.incident_id)
    assert (incident.scope, incident.kind, incident.report_count) == ("node", "node_unreachable", 3)


@pytest.mark.django_db
def test_a_batch_naming_a_device_the_node_lacks_stores_nothing(tenant_a):
    from controlplane.errors import ServiceError

    cluster = protected_cluster(nodes=1, spares=0, connection=INSTANT)
    node = node_of(submit(cluster, tenant_a, gpus=8))
    with pytest.raises(ServiceError):
        fault_ingest_many(
            source="agent",
            reports=[
                FaultReport(kind="nic_down", node=node, nic_name="mlx5_0"),
                FaultReport(kind="nic_down", node=node, nic_name="eth9"),
            ],
        )
    assert not FaultEvent.objects.exists()


@pytest.mark.django_db
def test_a_batch_of_eight_costs_a_few_statements_more_than_one(tenant_a):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    one, other = (node_of(submit(cluster, tenant_a, gpus=8)) for _ in range(2))
    with CaptureQueriesContext(connection) as single:
        fault_ingest_many(source="agent", reports=[FaultReport(kind="nic_down", node=one, nic_name="mlx5_0")])
    with CaptureQueriesContext(connection) as eight:
        fault_ingest_many(
            source="agent",
            reports=[FaultReport(kind="nic_down", node=other, nic_name=f"mlx5_{i}") for i in range(8)],
        )
    assert len(eight.captured_queries) == len(single.captured_queries)


def _queued() -> int:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL).llen("faults")


@pytest.mark.django_db(transaction=True)
def test_a_cluster_waiting_for_its_handling_queues_no_second_one(tenant_a):
    cluster = protected_cluster(nodes=3, spares=0, connection=INSTANT)
    nodes = [node_of(submit(cluster, tenant_a, gpus=8)) for _ in range(3)]
    before = _queued()
    first, _ = fault_ingest(source="agent", kind="nic_down", node=nodes[0], nic_name="mlx5_1")
    fault_ingest(source="agent", kind="nic_down", node=nodes[1], nic_name="mlx5_1")
    assert _queued() == before + 1  # the second waits for the handling already queued
    assert len(fault_handle(fault_id=first.pk, cluster_id=cluster.pk)) == 2  # which decides both
    assert not FaultEvent.objects.filter(state=FaultState.NEW).exists()
    fault_ingest(source="agent", kind="nic_down", node=nodes[2], nic_name="mlx5_1")
    assert _queued() == before + 2  # the handler forgot the mark as it began: a new one is queued
    assert fault_handle(fault_id=first.pk, cluster_id=cluster.pk) != []
    assert fault_handle(fault_id=first.pk, cluster_id=cluster.pk) == []  # twice: nothing new


@pytest.mark.django_db(transaction=True)
def test_a_fault_stored_while_a_decision_runs_gets_the_next_handling(tenant_a):
    """Its intake finds the cluster's handling under way (the mark set) and queues nothing; the handling, once its
    decision is committed, sees it still new and queues the next one."""
    import threading

    from django.db import close_old_connections, transaction

    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    nodes = [node_of(submit(cluster, tenant_a, gpus=8)) for _ in range(2)]
    before = _queued()
    first, _ = fault_ingest(source="agent", kind="nic_down", node=nodes[0], nic_name="mlx5_1")
    later, _ = fault_ingest(source="agent", kind="nic_down", node=nodes[1], nic_name="mlx5_1")
    assert _queued() == before + 1
    held, release = threading.Event(), threading.Event()

    def another_decision_holds_it():  # as a handler of another batch would: the row locked, not yet decided
        try:
            with transaction.atomic():
                FaultEvent.objects.select_for_update().get(pk=later.pk)
                held.set()
                release.wait(10)
        finally:
            close_old_connections()

    thread = threading.Thread(target=another_decision_holds_it)
    thread.start()
    assert held.wait(10)
    try:
        assert len(fault_handle(fault_id=first.pk, cluster_id=cluster.pk)) == 1  # the free one only
    finally:
        release.set()
        thread.join(10)
    assert _queued() == before + 2  # the next handling, for the one still new
    assert len(fault_handle(fault_id=later.pk, cluster_id=cluster.pk)) == 1
    assert _queued() == before + 2  # and nothing after it: no new fault is left
