"""The cluster list's GPU columns: GPUs, GPUs busy (held by a running allocation), GPUs faulty and nodes cordoned,
counted by annotations of the cluster rows, so the page's queries do not grow with its rows."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleet.models import GPU
from jobs.services.jobs import job_submit
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


def columns(html: str, cluster) -> dict[str, str]:
    """The row of ``cluster``: its GPU columns' text."""
    row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*?>{re.escape(cluster.name)}</a>.*?</tr>", html, re.S).group(0)
    cells = dict(re.findall(r'data-column="([\w-]+)"[^>]*>(.*?)</td>', row, re.S))
    return {name: re.sub(r"<[^>]+>", "", text).strip() for name, text in cells.items()}


def test_gpu_columns_count_busy_faulty_and_cordoned(client, users, tenant_a):
    cluster = make_cluster(driver="kubernetes", dedicated_tenant=tenant_a)
    nodes = [make_node(cluster, f"g{i}") for i in range(3)]
    make_node(cluster, "g-out", state="cordoned")
    GPU.objects.filter(node=nodes[2], index__in=[1, 6]).update(health="failed")
    job_submit(
        actor=users["operator"], tenant=tenant_a, cluster=cluster, name="run", gpus=12, hostnames=["g0", "g1"]
    )
    idle = make_cluster(driver="kubernetes")
    client.force_login(users["provider-admin"])
    html = client.get(reverse("fleet-clusters")).content.decode()
    assert columns(html, cluster) == {
        "gpus": "32",
        "gpus-busy": "12",
        "gpus-faulty": "2",
        "nodes-cordoned": "1",
    }
    assert columns(html, idle) == {"gpus": "0", "gpus-busy": "0", "gpus-faulty": "0", "nodes-cordoned": "0"}
    # A tenant sees its own cluster's counts, and no other cluster.
    client.force_login(users["tenant-viewer"])
    html = client.get(reverse("fleet-clusters")).content.decode()
    assert columns(html, cluster)["gpus-busy"] == "12" and idle.name not in html


def test_gpu_columns_take_no_query_per_row(client, users, django_assert_max_num_queries):
    client.force_login(users["provider-admin"])
    first = make_cluster()
    make_node(first, gpus=8)
    with CaptureQueriesContext(connection) as one:
        client.get(reverse("fleet-clusters"))
    for _ in range(6):  # in the same fleet (the page's banners read per fleet)
        cluster = make_cluster(fleet=first.fleet)
        make_node(cluster, gpus=8)
        make_node(cluster, gpus=4, state="cordoned")
    with django_assert_max_num_queries(len(one)):
        assert client.get(reverse("fleet-clusters")).content.decode().count('data-column="gpus-busy"') == 7
