"""The node page's telemetry: per-GPU series from the samples the agent sent (through the real ingest), bounded
in points and in queries whatever the number of GPUs or samples, the node's faults and actions on the same time
axis, a range the page does not offer refused, and another tenant's node not found."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from telemetry.models import NodeMinute
from telemetry.selectors import CHART_POINTS
from tests.support.factories import make_cluster, make_node
from tests.support.incidents import make_incident
from tests.support.node_telemetry import node_with_an_xid, seed_node_history

pytestmark = pytest.mark.django_db


def charts_of(response) -> dict:
    """The data the page hands its chart script (json_script)."""
    html = response.content.decode()
    start = html.index('<script id="node-charts-data" type="application/json">')
    body = html[html.index(">", start) + 1 : html.index("</script>", start)]
    return json.loads(body)


@pytest.fixture
def own(tenant_a):
    """Tenant A's dedicated cluster and one of its nodes, an hour of telemetry, an Xid and the reset it got."""
    return node_with_an_xid(
        make_cluster(dedicated_tenant=tenant_a), "a-0", gpus=4, nics=2, minutes=60, xid_gpu=2
    )


def test_node_page_charts_every_gpu_and_marks_the_xid_and_its_action(client, users, own):
    client.force_login(users["provider-admin"])
    response = client.get(reverse("node-detail", args=[own.pk]), {"range": "1h"})
    assert response.status_code == 200
    charts = charts_of(response)
    gpus = charts["gpus"]
    assert gpus["per_gpu"] is True and gpus["point"] == "mean"
    assert sorted(gpus["values"]["temperature"]) == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    # the hour's grid of 15 s buckets (and the partial one at its start); the samples fill one in two (every 30 s)
    assert len(gpus["x"]) <= CHART_POINTS + 1 and len(gpus["x"]) == len(gpus["values"]["power"]["GPU 0"])
    assert 110 <= sum(v is not None for v in gpus["values"]["power"]["GPU 0"]) <= 121
    hot = [v for v in gpus["values"]["temperature"]["GPU 3"] if v is not None]
    assert 52 <= min(hot) and max(hot) <= 74  # the wave, GPU 3 three degrees up
    assert {m["kind"] for m in charts["markers"]} == {"xid", "action"}
    xid = next(m for m in charts["markers"] if m["kind"] == "xid")
    assert xid["label"] == "gpu_xid 79" and xid["device"] == "gpu2"
    assert charts["memory"][0] == {"gpu": "GPU 0", "used": 60 * 2**30, "total": 80 * 2**30}
    assert charts["nics"][0]["counters"]["bytes"]["rx_bytes"] > 0
    assert charts["nics"][0]["counters"]["link changes"]["carrier_changes"] == 2


def test_nic_and_memory_series_share_the_gpu_charts_buckets(client, users, own):
    client.force_login(users["provider-admin"])
    charts = charts_of(client.get(reverse("node-detail", args=[own.pk]), {"range": "1h"}))
    gpus, nics = charts["gpus"], charts["nic_series"]
    memory = [v for v in gpus["values"]["memory"]["GPU 1"] if v is not None]
    assert 110 <= len(memory) <= 121 and set(memory) == {60 * 1024}  # MiB
    assert nics["kept"] is True and nics["point"] == "mean" and nics["x"] == gpus["x"]
    names = sorted(own.nics.values_list("name", flat=True))
    for series in ("rx_bytes", "tx_bytes", "errors", "drops", "link_changes"):
        assert sorted(nics["values"][series]) == names
    received = [v for v in nics["values"]["rx_bytes"][names[0]] if v is not None]
    assert 110 <= len(received) <= 121 and received == sorted(received) and received[-1] > received[0]
    assert {v for v in nics["values"]["link_changes"][names[1]] if v is not None} == {2}
    assert {v for v in nics["values"]["errors"][names[1]] if v is not None} == {0}  # the ingest's sum
    assert all(v is None for v in nics["values"]["drops"][names[0]])  # none reported
    # a day: 6-minute buckets, each the first reading in it
    day = charts_of(client.get(reverse("node-detail", args=[own.pk]), {"range": "24h"}))["nic_series"]
    assert day["step"] == 360 and day["point"] == "first" and len(day["x"]) <= CHART_POINTS + 1
    assert 10 <= sum(v is not None for v in day["values"]["tx_bytes"][names[0]]) <= 11
    # a week reaches past the raw samples: no NIC series, the latest counters instead
    response = client.get(reverse("node-detail", args=[own.pk]), {"range": "7d"})
    week = charts_of(response)
    assert week["nic_series"]["kept"] is False and week["nic_series"]["has_data"] is False
    assert week["gpus"]["values"]["memory"] == {} and len(week["nics"]) == 2
    assert b"NIC samples are kept 24 h" in response.content


def test_long_ranges_are_bucketed_to_at_most_chart_points(client, users, own):
    client.force_login(users["provider-admin"])
    charts = charts_of(client.get(reverse("node-detail", args=[own.pk]), {"range": "24h"}))
    assert charts["gpus"]["step"] == 360 and charts["gpus"]["point"] == "first"  # 24 h in 240 buckets
    assert len(charts["gpus"]["x"]) <= CHART_POINTS + 1
    # the hour of samples falls in about ten 6-minute buckets
    firsts = [v for v in charts["gpus"]["values"]["temperature"]["GPU 1"] if v is not None]
    assert 10 <= len(firsts) <= 11 and all(
        51 <= v <= 71 for v in firsts
    )  # readings as sent: GPU 1 is 61 ± 10
    # Beyond the raw samples' retention, the node's per-minute history: the mean of its GPUs and the hottest.
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(days=6)
    NodeMinute.objects.bulk_create(
        NodeMinute(
            node=own,
            minute=start + timedelta(minutes=i),
            samples=24,
            temperature_max=80.0,
            temperature_sum=24 * 70.0,
            power_sum=24 * 500.0,
            utilization_sum=24 * 90.0,
        )
        for i in range(0, 3000, 3)
    )
    charts = charts_of(client.get(reverse("node-detail", args=[own.pk]), {"range": "7d"}))
    week = charts["gpus"]
    assert week["per_gpu"] is False and len(week["x"]) <= CHART_POINTS + 1
    assert set(week["values"]["temperature"]) == {"hottest GPU", "mean of a-0's GPUs"}
    assert 80.0 in week["values"]["temperature"]["hottest GPU"]
    assert 70.0 in week["values"]["temperature"]["mean of a-0's GPUs"]
    assert week["values"]["sbe"] == {}


@pytest.mark.parametrize("asked", ["2h", "15m", "30d", "", "7 d", "1h;DROP"])
def test_a_range_the_page_does_not_offer_is_a_400(client, users, own, asked):
    client.force_login(users["provider-admin"])
    response = client.get(reverse("node-detail", args=[own.pk]), {"range": asked})
    assert response.status_code == 400
    assert b"1h, 6h, 24h, 7d" in response.content


def test_another_tenants_node_page_is_not_found(client, users, own):
    client.force_login(users["other-admin"])
    assert client.get(reverse("node-detail", args=[own.pk])).status_code == 404
    client.force_login(users["tenant-viewer"])
    response = client.get(reverse("node-detail", args=[own.pk]))
    assert response.status_code == 200  # its own dedicated cluster's node: its GPUs' series, the Xid
    charts = charts_of(response)
    assert len(charts["gpus"]["values"]["power"]) == 4 and len(charts["nics"]) == 2
    assert len(charts["nic_series"]["values"]["rx_bytes"]) == 2
    assert [m["kind"] for m in charts["markers"]] == ["xid"]  # the reset was of no job of theirs


def page_queries(client, node, range_: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(reverse("node-detail", args=[node.pk]), {"range": range_}).status_code == 200
    return len(captured)


@pytest.mark.parametrize("range_", ["1h", "24h", "7d"])
def test_queries_do_not_grow_with_gpus_nics_or_samples(
    client, users, tenant_a, own, range_, django_assert_max_num_queries
):
    client.force_login(users["tenant-admin"])
    small = page_queries(client, own, range_)
    cluster = own.cluster
    big = make_node(cluster, "a-1", gpus=16, nics=8)
    seed_node_history(cluster, big, minutes=90, every=10)
    make_incident(
        big, reports=[{"kind": "thermal", "gpu_index": 5}, {"kind": "nic_down", "nic_name": "mlx5_1"}]
    )
    with django_assert_max_num_queries(small):
        client.get(reverse("node-detail", args=[big.pk]), {"range": range_})
