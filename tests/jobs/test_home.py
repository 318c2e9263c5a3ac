"""The landing pages: the provider's dashboard and a tenant's self-service view."""

import html
import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.choices import GPUHealth, NodeState
from jobs.models import Job
from jobs.services.faults import fault_ingest
from jobs.services.jobs import job_submit
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(tenant_a, tenant_b):
    shared = make_cluster(name="shared-1")
    mine = make_cluster(name="acme-only", dedicated_tenant=tenant_a)
    theirs = make_cluster(name="globex-only", dedicated_tenant=tenant_b)
    nodes = [make_node(shared, f"s{i}") for i in range(4)] + [make_node(mine, f"a{i}") for i in range(2)]
    make_node(theirs, "g0")
    bad = nodes[1].gpus.get(index=2)
    bad.health = GPUHealth.FAILED
    bad.save()
    nodes[3].state = NodeState.FAILED
    nodes[3].save()
    return {"shared": shared, "mine": mine, "theirs": theirs, "nodes": nodes}


def dashboard_data(page: str) -> dict:
    start = page.index('<script id="dashboard-data" type="application/json">') + len(
        '<script id="dashboard-data" type="application/json">'
    )
    return json.loads(page[start : page.index("</script>", start)])


def test_provider_dashboard_figures_and_heatmap(client, users, fleet):
    fault_ingest(source="api", kind="nic_down", node=fleet["nodes"][0], nic_name="mlx5_0")
    client.force_login(users["operator"])
    page = client.get("/").content.decode()
    data = dashboard_data(page)
    figures = data["figures"]
    assert figures["clusters"] == 3 and figures["nodes"] == 7 and figures["gpus"] == 56
    # 56 GPUs less the failed one on s1 and the 8 of the failed node s3 (its GPUs' own rows still say healthy)
    assert figures["gpus_healthy"] == 47 and figures["faults_24h"] == 1 and figures["nodes_out"] == 1
    shared = next(c for c in data["clusters"] if c["name"] == "shared-1")
    assert shared["heatmap"]["hosts"] == ["s0", "s1", "s2", "s3"]
    assert shared["heatmap"]["unhealthy"] == [0, 1, 0, -1]
    assert (
        shared["heatmap"]["ids"] == [n.pk for n in fleet["nodes"][:4]]
        and shared["heatmap"]["gpus"] == [8] * 4
    )
    assert "vendor/plotly.min.js" in page and 'id="heatmap-' in page


def test_provider_dashboard_query_count_does_not_grow_with_the_fleet(client, users, fleet):
    client.force_login(users["operator"])
    client.get("/")
    with CaptureQueriesContext(connection) as small:
        client.get("/")
    for i in range(20):
        make_node(fleet["shared"], f"more{i}")
    make_cluster(name="another")
    with CaptureQueriesContext(connection) as large:
        client.get("/")
    assert len(large.captured_queries) == len(small.captured_queries)


def test_tenant_sees_only_its_own_jobs_and_clusters(client, users, fleet, tenant_a, tenant_b):
    job_submit(actor=users["tenant-admin"], tenant=tenant_a, cluster=fleet["mine"], name="acme-train", gpus=8)
    job_submit(
        actor=users["other-admin"], tenant=tenant_b, cluster=fleet["theirs"], name="globex-secret", gpus=8
    )
    client.force_login(users["tenant-viewer"])
    page = client.get("/").content.decode()
    assert "acme-train" in page and "acme-only" in page
    assert "globex" not in page.lower() and "Submit a job" not in page
    assert f'data-topic="tenant-{tenant_a.pk}"' in page


def test_tenant_admin_submits_a_job_from_the_page(client, users, fleet, tenant_a):
    client.force_login(users["tenant-admin"])
    response = client.post(
        "/",
        {
            "name": "from-page",
            "cluster": fleet["mine"].pk,
            "gpus": 8,
            "seconds_per_iteration": 2,
            "checkpoint_interval": 100,
        },
    )
    assert response.status_code == 302
    assert Job.objects.get(name="from-page").tenant == tenant_a
    refused = client.post("/", {"name": "sneaky", "cluster": fleet["theirs"].pk, "gpus": 8}).content.decode()
    assert "No such cluster for this tenant" in refused and not Job.objects.filter(name="sneaky").exists()
    bad = client.post("/", {"name": "x", "cluster": "nope", "gpus": "many"}).content.decode()
    assert "whole numbers" in bad


def test_viewer_cannot_submit(client, users, fleet):
    client.force_login(users["tenant-viewer"])
    client.post("/", {"name": "viewer-job", "cluster": fleet["mine"].pk, "gpus": 8})
    assert not Job.objects.filter(name="viewer-job").exists()


def test_job_list_sorts_filters_paginates_and_keeps_the_live_hooks(client, users, fleet, tenant_a):
    for n, gpus in enumerate((4, 8, 6)):
        job_submit(
            actor=users["tenant-admin"],
            tenant=tenant_a,
            cluster=fleet["mine"] if n else fleet["shared"],
            name=f"job-{n}",
            gpus=gpus,
        )
    client.force_login(users["operator"])
    page = client.get("/jobs/", {"sort": "-gpus"}).content.decode()
    assert page.index("job-1") < page.index("job-2") < page.index("job-0")
    assert (
        'id="job-table"' in page
        and 'data-topic="fleet"' in page
        and "data-job=" in page
        and 'class="state"' in page
    )
    filtered = client.get("/jobs/", {"cluster": fleet["shared"].pk}).content.decode()
    assert "job-0" in filtered and "job-1" not in filtered
    client.force_login(users["other-viewer"])
    assert "job-0" not in client.get("/jobs/").content.decode()


def test_tenant_home_judges_protection_as_each_jobs_page_does(client, users, tenant_a):
    """The cluster rows of a tenant's home count the tenant's running jobs protected by jobs.protection, the
    verdict of the job page: a simulated job that reports its progress stays protected on a protected cluster; a
    real job whose runtime never reported is not, though its cluster's add-ons are all there."""
    from jobs.protection import job_protection
    from jobs.services.jobs import job_progress
    from tests.support.jobs import protected_cluster, submit

    cluster = protected_cluster(nodes=4, spares=1, tenant=tenant_a)
    simulated, real = submit(cluster, tenant_a, gpus=8), submit(cluster, tenant_a, gpus=8)
    job_progress(job=simulated, iteration=10, step_seconds=1.0)
    client.force_login(users["tenant-admin"])
    row = re.search(
        r'data-protected-jobs="(\d+)" data-running-jobs="(\d+)">(.*?)</td>', client.get("/").content.decode()
    )
    assert (
        row.groups()[:2] == ("2", "2") and "protected" in row.group(3) and "unprotected" not in row.group(3)
    )

    Job.objects.filter(pk=real.pk).update(simulated=False, reports_progress=True)  # registered by a launcher
    real.refresh_from_db()
    assert not job_protection(real).protected and job_protection(simulated).protected
    row = re.search(
        r'data-protected-jobs="(\d+)" data-running-jobs="(\d+)">(.*?)</td>', client.get("/").content.decode()
    )
    assert row.groups()[:2] == ("1", "2") and "unprotected" in row.group(3)
    assert job_protection(real).reason in html.unescape(row.group(3))
