"""Detail pages and search in a real browser: from the fault feed to an incident and on to its node by the links,
and the header's search box leading a tenant to its own job and its nodes, never to another tenant's."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from fleet.models import Cluster
from jobs.models import FaultEvent, Incident, Job, RecoveryAction
from simulator.world import world_build
from tests.support.browser import log_in, screenshot, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


@pytest.fixture
def world():
    """The demo world, and an incident on the node of one of each tenant's jobs on its own cluster, which the
    job's recovery answered."""
    world_build(seed=11, nodes_per_cluster=8, spares=2)
    for name in ("lockstep-simulator", "acme-admin", "nimbus-viewer"):
        usable_password(User.objects.get(username=name), PASSWORD)
    found = {}
    now = timezone.now()
    for slug in ("acme", "nimbus"):
        cluster = Cluster.objects.get(dedicated_tenant__slug=slug)
        job = Job.objects.filter(tenant__slug=slug, cluster=cluster).order_by("pk").first()
        node = job.allocations.filter(released_at__isnull=True).first().node
        incident = Incident.objects.create(
            cluster=cluster, node=node, kind="gpu_xid", xid=79, opened_at=now, last_reported_at=now
        )
        fault = FaultEvent.objects.create(
            kind="gpu_xid",
            xid=79,
            gpu_index=2,
            cluster=cluster,
            node=node,
            sources=["agent"],
            detected_at=now,
            received_at=now,
            correlation_key=f"browser-detail-{slug}",
            incident=incident,
        )
        RecoveryAction.objects.create(
            incident=incident,
            fault=fault,
            job=job,
            cluster=cluster,
            node=node,
            kind="restart_from_checkpoint",
            state="succeeded",
            detected_at=now,
            ended_at=now + timedelta(seconds=30),
            gpus=job.gpus,
            gpu_hours_baseline=4.0,
            gpu_hours_lost=1.5,
            gpu_hours_saved=2.5,
            alternatives=[
                {
                    "kind": "live_migration",
                    "feasible": False,
                    "gpu_hours_lost": 0.3,
                    "pause_seconds": 30,
                    "work_lost_seconds": 0,
                    "why": "no spare node",
                }
            ],
        )
        found[slug] = {"job": job, "node": node, "incident": incident}
    return found


def test_fault_feed_to_incident_to_node(page, server, world):
    acme = world["acme"]
    log_in(page, server.url, "lockstep-simulator", PASSWORD)
    page.goto(f"{server.url}/faults/")
    row = page.locator(f'#fault-feed > li[data-incident="{acme["incident"].pk}"]')
    row.locator("a.incident-link").click()
    page.wait_for_url(f"{server.url}/incidents/{acme['incident'].pk}/")
    assert page.locator("#ledger-saved").inner_text() == "2.50"
    assert "no spare node" in page.locator("[data-alternatives-of]").inner_text()
    screenshot(page, "incident-page")
    page.locator("#incident-node a").click()
    page.wait_for_url(f"{server.url}/nodes/{acme['node'].pk}/")
    assert page.locator("h1").inner_text().startswith(acme["node"].hostname)
    fault_row = page.locator("#node-fault-table tr[data-fault]").first
    assert f"incident {acme['incident'].pk}" in fault_row.inner_text()
    assert page.locator("#node-allocations tr.current[data-job]").count() >= 1
    screenshot(page, "node-page")
    # The node page leads back to its cluster, and the cluster page to its fabric.
    page.locator(".page-links a").first.click()
    page.wait_for_url(f"{server.url}/clusters/{acme['node'].cluster_id}/")
    page.locator("#cluster-fabric-link").click()
    page.wait_for_url(f"{server.url}/fabric/{acme['node'].cluster_id}/")


def test_header_search_leads_a_tenant_to_its_own_job_and_its_nodes_only(page, server, world):
    acme, nimbus = world["acme"], world["nimbus"]
    log_in(page, server.url, "acme-admin", PASSWORD)
    page.locator("#site-search").fill(acme["job"].name)
    page.locator("#site-search").press("Enter")
    page.wait_for_url(f"{server.url}/search/?q=*")
    result = page.locator(f'#results-jobs li[data-job="{acme["job"].pk}"] a')
    assert result.count() == 1
    screenshot(page, "search-results")
    result.click()
    page.wait_for_url(f"{server.url}/jobs/{acme['job'].pk}/")
    page.locator(f'#job-node-table tr.current[data-node="{acme["node"].pk}"] a').click()
    page.wait_for_url(f"{server.url}/nodes/{acme['node'].pk}/")

    # Another tenant's job, node and incident: search finds none of them, and their pages are 404s.
    for q in (nimbus["job"].name, nimbus["node"].hostname, str(nimbus["incident"].pk)):
        page.locator("#site-search").fill(q)
        page.locator("#site-search").press("Enter")
        page.wait_for_url(f"{server.url}/search/?q=*")
        assert (
            page.locator(
                f'[data-job="{nimbus["job"].pk}"], [data-node="{nimbus["node"].pk}"], '
                f'[data-incident="{nimbus["incident"].pk}"]'
            ).count()
            == 0
        ), q
    for path in (
        f"/incidents/{nimbus['incident'].pk}/",
        f"/nodes/{nimbus['node'].pk}/",
        f"/jobs/{nimbus['job'].pk}/",
    ):
        assert page.goto(f"{server.url}{path}").status == 404, path
    assert page.goto(f"{server.url}/incidents/{acme['incident'].pk}/").status == 200


def test_a_viewer_sees_its_incident_and_is_refused_the_other(page, server, world):
    log_in(page, server.url, "nimbus-viewer", PASSWORD)
    assert page.goto(f"{server.url}/incidents/{world['nimbus']['incident'].pk}/").status == 200
    assert page.locator("#incident-actions tr[data-action]").count() == 1
    assert page.goto(f"{server.url}/incidents/{world['acme']['incident'].pk}/").status == 404
    assert page.goto(f"{server.url}/search/?q={'x' * 101}").status == 400
