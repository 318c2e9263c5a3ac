"""Time ranges on the chart pages: ?range=15m|1h|6h|24h|7d|30d filters the charts' data on the server; a value not
offered falls back to the page's default (never an error); the picker keeps the page's other parameters."""

import json
import re
from datetime import timedelta

import pytest
from django.test import RequestFactory
from django.utils import timezone

from controlplane.timerange import RANGES, time_range
from jobs.models import FaultEvent, JobProgress
from jobs.services.faults import fault_ingest
from jobs.services.jobs import job_submit
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def json_script(page: str, element_id: str) -> dict:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(match[1])


def test_a_range_is_one_of_four_and_anything_else_is_the_default():
    factory = RequestFactory()
    for key, (label, span, _) in RANGES.items():
        window = time_range(factory.get("/", {"range": key}))
        assert window.key == key and window.label == label and window.now - window.since == span
    for junk in ["", "1y", "15M", "7d;drop", "%00", "7" * 5000]:
        assert time_range(factory.get("/", {"range": junk}), default="30d").key == "30d"
    assert time_range(factory.get("/")).key == "7d"


def test_the_pickers_links_keep_the_other_parameters_and_start_at_the_first_page():
    window = time_range(RequestFactory().get("/faults/", {"cluster": "3", "page": "4", "range": "6h"}))
    links = {option["key"]: option["href"] for option in window.options}
    assert set(links) == {"15m", "1h", "6h", "24h", "7d", "30d"}
    assert links["30d"] == "?cluster=3&range=30d"
    assert [option["key"] for option in window.options if option["current"]] == ["6h"]


@pytest.fixture
def node():
    cluster = make_cluster(name="ranges-1")
    return make_node(cluster, "r0")


def backdate_faults(hours: float) -> None:
    FaultEvent.objects.update(
        received_at=timezone.now() - timedelta(hours=hours),
        detected_at=timezone.now() - timedelta(hours=hours),
    )


def test_the_fleet_charts_cover_the_range_asked_for(client, users, node):
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0")
    backdate_faults(3)  # three hours ago: inside 6 h and 7 d, outside 15 min
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_1")
    client.force_login(users["operator"])
    counts = {}
    for key in ["15m", "6h", "7d", "30d", "bogus"]:
        response = client.get("/", {"range": key})
        assert response.status_code == 200
        data = json_script(response.content.decode(), "dashboard-data")["charts"]
        counts[key] = sum(point["v"] for point in data["faults"])
        # the default fits the data: the first fault, three hours old, is inside 6 h (tests/home)
        assert data["range"]["key"] == ("6h" if key == "bogus" else key)
    assert counts == {"15m": 1, "6h": 2, "7d": 2, "30d": 2, "bogus": 2}
    page = client.get("/", {"range": "15m"}).content.decode()
    assert 'data-time-range="15m"' in page and "Faults per minute (last 15 min)" in page
    assert re.search(r'href="\?range=30d"[^>]*>', page) and 'aria-current="true"' in page
    # the chart's text alternative says what it shows
    assert "1 fault in 1 interval" in page


def test_the_fault_overview_counts_the_range(client, users, node):
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0")
    backdate_faults(24 * 8)
    client.force_login(users["operator"])
    week = json_script(client.get("/faults/", {"range": "7d"}).content.decode(), "stats-data")
    month = json_script(client.get("/faults/", {"range": "30d"}).content.decode(), "stats-data")
    assert week["totals"]["faults"] == 0 and month["totals"]["faults"] == 1
    assert client.get("/faults/", {"range": "[]"}).status_code == 200


def test_the_job_timeline_covers_the_range(client, users, tenant_a):
    cluster = make_cluster(name="ranges-2", dedicated_tenant=tenant_a)
    make_node(cluster, "j0")
    job, _ = job_submit(actor=users["tenant-admin"], tenant=tenant_a, cluster=cluster, name="ranged", gpus=8)
    now = timezone.now()
    for hours, iteration in [(48, 10), (5, 20), (0.1, 30)]:
        JobProgress.objects.create(job=job, at=now - timedelta(hours=hours), iteration=iteration)
    client.force_login(users["tenant-viewer"])
    six_hours = json_script(client.get(f"/jobs/{job.pk}/", {"range": "6h"}).content.decode(), "timeline-data")
    month = json_script(client.get(f"/jobs/{job.pk}/", {"range": "30d"}).content.decode(), "timeline-data")
    # the window's points, and the last one before it (the line starts at the window's edge)
    assert six_hours["iterations"]["actual"][:3] == [10, 20, 30]
    fifteen = json_script(client.get(f"/jobs/{job.pk}/", {"range": "15m"}).content.decode(), "timeline-data")
    assert fifteen["iterations"]["actual"][:2] == [20, 30] and month["iterations"]["actual"][:3] == [
        10,
        20,
        30,
    ]
    assert client.get(f"/jobs/{job.pk}/", {"range": "x" * 300}).status_code == 200


def test_the_timeline_api_takes_the_same_ranges_and_refuses_others(api, users, tenant_a):
    cluster = make_cluster(name="ranges-3", dedicated_tenant=tenant_a)
    make_node(cluster, "k0")
    job, _ = job_submit(
        actor=users["tenant-admin"], tenant=tenant_a, cluster=cluster, name="ranged-api", gpus=8
    )
    JobProgress.objects.create(job=job, at=timezone.now() - timedelta(days=3), iteration=5)
    JobProgress.objects.create(job=job, at=timezone.now() - timedelta(days=2), iteration=7)
    api.as_token(users["tenant-viewer"], "read")
    whole = api.get(f"/api/v1/jobs/{job.pk}/timeline/").json()
    day = api.get(f"/api/v1/jobs/{job.pk}/timeline/", {"range": "6h"}).json()
    assert whole["iterations"]["actual"][:2] == [5, 7] and day["iterations"]["actual"][0] == 7
    refused = api.get(f"/api/v1/jobs/{job.pk}/timeline/", {"range": "1y"})
    assert refused.status_code == 400 and "range" in refused.json()
