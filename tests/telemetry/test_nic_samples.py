"""Raw NIC samples and GPU memory per sample: stored by the real ingest (both stores) with no statement added to
a batch, the agent's counters summed per group as the node page charts them, and pruned with the GPU samples."""

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from telemetry.models import GPUSample, NICSample
from telemetry.services import ingest
from telemetry.services.ingest import telemetry_ingest
from telemetry.services.retention import telemetry_prune
from tests.support.factories import make_cluster, make_node
from tests.support.statements import SentStatements
from tests.support.telemetry import batch, nic, reading

pytestmark = pytest.mark.django_db
GIB = 2**30


@pytest.fixture(params=["postgresql", "portable"])
def store(request, monkeypatch):
    if request.param == "portable":
        monkeypatch.setattr(ingest, "PostgresStore", ingest.PortableStore)
    return request.param


def test_nic_counters_and_gpu_memory_are_stored_per_reading(store):
    cluster = make_cluster()
    node = make_node(cluster, "n-0", gpus=2, nics=2)
    first, second = node.nics.order_by("rail").values_list("name", flat=True)
    now = time.time()
    body = batch(
        "n-0",
        readings=[reading(g, now - 10, DCGM_FI_DEV_FB_USED=(g + 1) * GIB) for g in range(2)],
        nics=[
            # a RoCE port with its netdev: both sets of counters; rx_crc_errors is part of rx_errors
            nic(
                first,
                now - 10,
                rx_bytes=10**12,
                tx_bytes=5 * 10**11,
                rx_errors=3,
                tx_errors=1,
                rx_crc_errors=3,
                symbol_error=2,
                port_rcv_errors=4,
                rx_dropped=5,
                port_xmit_discards=6,
                carrier_changes=7,
                link_downed=1,
            ),
            nic(second, now - 20, link_downed=2),  # InfiniBand only: no bytes, no drops
            nic(second, now - 10, link_downed=3, port_rcv_errors=1),
            nic("mgmt0", now - 10),  # not managed by Lockstep: not stored
        ],
    )
    telemetry_ingest(cluster=cluster, body=json.dumps(body).encode())
    rows = {
        (name, ts): row
        for name, ts, *row in NICSample.objects.order_by("ts").values_list(
            "nic_id", "ts", "rx_bytes", "tx_bytes", "errors", "drops", "link_changes"
        )
    }
    ids = dict(node.nics.values_list("name", "id"))
    by_nic = {name: [row for (nic_id, _), row in rows.items() if nic_id == ids[name]] for name in ids}
    assert by_nic[first] == [[10**12, 5 * 10**11, 10, 11, 7]]
    assert by_nic[second] == [[None, None, 0, None, 2], [None, None, 1, None, 3]]
    assert NICSample.objects.count() == 3
    assert sorted(GPUSample.objects.values_list("memory_used", flat=True)) == [GIB, 2 * GIB]


def test_nic_samples_add_no_statement_to_a_batch(store):
    if store != "postgresql":
        pytest.skip("the statement count is the PostgreSQL store's")
    cluster = make_cluster()
    node = make_node(cluster, "n-1", gpus=8, nics=8)
    names = list(node.nics.values_list("name", flat=True))
    now = time.time()

    def send(ts, per_nic):
        nics = [nic(name, ts - step, rx_bytes=step) for name in names for step in range(per_nic)]
        body = batch("n-1", readings=[reading(g, ts) for g in range(8)], nics=nics)
        with SentStatements() as sent:
            telemetry_ingest(cluster=cluster, body=json.dumps(body).encode())
        return len(sent.work())

    send(now - 50, 1)  # the first batch also loads the cluster's inventory
    assert send(now - 30, 1) == 2 and send(now - 10, 5) == 2
    assert NICSample.objects.count() == 8 * 7


def test_retention_prunes_nic_samples_with_the_gpu_samples(settings, store):
    settings.TELEMETRY_RAW_RETENTION_HOURS = 24
    node = make_node(make_cluster())
    now = timezone.now()
    nic_id = node.nics.first().pk
    NICSample.objects.bulk_create(
        [NICSample(ts=now - timedelta(hours=h), nic_id=nic_id, rx_bytes=h) for h in (1, 23, 25, 48)]
    )
    counts = telemetry_prune(now=now)
    assert counts["nic_samples"] == 2
    assert sorted(NICSample.objects.values_list("rx_bytes", flat=True)) == [1, 23]
    assert telemetry_prune(now=now)["nic_samples"] == 0
