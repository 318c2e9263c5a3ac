"""Time-range defaults that fit the data (issue 47): the provider home's charts open on the smallest of 1 h, 6 h,
24 h and 7 d that holds the fleet's first fault, and the job page's on the smallest of those and 30 d that holds
the job's life; ?range= still wins."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.timerange import fitting
from jobs.models import FaultEvent, Job
from jobs.services.faults import fault_ingest
from tests.support.factories import make_cluster, make_node
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("age", "keys", "expected"),
    [
        (None, None, "1h"),
        (timedelta(minutes=20), None, "1h"),
        (timedelta(hours=1), None, "1h"),
        (timedelta(hours=3), None, "6h"),
        (timedelta(hours=20), None, "24h"),
        (timedelta(days=2), None, "7d"),
        (timedelta(days=12), None, "7d"),
        (timedelta(days=12), ("1h", "6h", "24h", "7d", "30d"), "30d"),
        (timedelta(days=90), ("1h", "6h", "24h", "7d", "30d"), "30d"),
    ],
)
def test_fitting_picks_the_smallest_window_that_holds_the_data(age, keys, expected):
    now = timezone.now()
    first = None if age is None else now - age
    assert fitting(first, now=now, **({"keys": keys} if keys else {})) == expected


def shown_range(html: str) -> str:
    return re.search(r'data-time-range="([^"]+)"', html).group(1)


def test_a_new_fleets_home_opens_on_its_first_hour(client, users):
    node = make_node(make_cluster(name="new-fleet"), "n0")
    client.force_login(users["provider-admin"])
    html = client.get("/").content.decode()
    assert shown_range(html) == "1h" and "(last 1 h)" in html  # no fault yet
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0")
    html = client.get("/").content.decode()
    assert shown_range(html) == "1h" and "Faults per minute (last 1 h)" in html


@pytest.mark.parametrize(("hours", "expected"), [(3, "6h"), (20, "24h"), (50, "7d"), (24 * 40, "7d")])
def test_the_home_range_grows_with_the_fleets_first_fault(client, users, hours, expected):
    node = make_node(make_cluster(name="older-fleet"), "n0")
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0")
    FaultEvent.objects.update(received_at=timezone.now() - timedelta(hours=hours))
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_1")
    client.force_login(users["operator"])
    assert shown_range(client.get("/").content.decode()) == expected
    assert shown_range(client.get("/", {"range": "15m"}).content.decode()) == "15m"


def test_the_providers_range_counts_faults_on_dedicated_clusters(client, users, tenant_a):
    node = make_node(make_cluster(name="acme-dedicated", dedicated_tenant=tenant_a), "n0")
    fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0")
    FaultEvent.objects.update(received_at=timezone.now() - timedelta(hours=3))
    client.force_login(users["provider-admin"])
    assert shown_range(client.get("/").content.decode()) == "6h"


@pytest.mark.parametrize(("hours", "expected"), [(0, "1h"), (2, "6h"), (24 * 10, "30d")])
def test_the_job_page_opens_on_the_jobs_life(client, users, tenant_a, hours, expected):
    job = submit(protected_cluster(nodes=4, spares=1, tenant=tenant_a), tenant_a, gpus=8)
    if hours:
        Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(hours=hours))
    client.force_login(users["tenant-viewer"])
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert shown_range(html) == expected
    assert shown_range(client.get(f"/jobs/{job.pk}/", {"range": "7d"}).content.decode()) == "7d"
