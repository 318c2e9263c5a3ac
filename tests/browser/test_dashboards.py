"""The dashboards in a real browser against a live server: a fault on the open job page within a second, tenant
isolation by URL, and screenshots of the main pages (test-artifacts/, the best of them in the README)."""

import time

import pytest
import requests
from django.contrib.auth import get_user_model

from jobs.models import Job
from simulator.world import world_build
from tests.support.browser import log_in, publish_in_a_thread, screenshot, usable_password
from tests.support.factories import token_header

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


@pytest.fixture
def world():
    world_build(seed=11, nodes_per_cluster=32, spares=4)
    admin = User.objects.get(username="lockstep-simulator")
    usable_password(admin, PASSWORD)
    for name in ("acme-admin", "nimbus-admin", "nimbus-viewer"):
        usable_password(User.objects.get(username=name), PASSWORD)
    return admin


def test_fault_reported_through_the_api_shows_on_the_open_job_page_within_a_second(page, server, world):
    job = Job.objects.filter(cluster__name="use-h200-b", state="Running").first()
    node = job.allocations.filter(released_at__isnull=True).first().node
    log_in(page, server.url, world.username, PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    page.wait_for_function("() => document.getElementById('job-timeline').data !== undefined", timeout=10_000)
    before = page.evaluate("() => document.getElementById('job-timeline').data[3].x.length")
    auth = {"Authorization": token_header(world, "write")["HTTP_AUTHORIZATION"]}
    response = requests.post(
        f"{server.url}/api/v1/faults/",
        json={"node": node.pk, "kind": "nic_down", "nic_name": "mlx5_2"},
        headers=auth,
        timeout=10,
    )
    assert response.status_code in (200, 201), response.text
    posted = time.monotonic()
    page.wait_for_function(
        f"() => document.getElementById('job-timeline').data[3].x.length > {before}", timeout=1_000
    )
    assert time.monotonic() - posted < 1.0
    screenshot(page, "job-page-fault")


def test_tenant_cannot_reach_another_tenants_job_by_url(page, server, world):
    other = Job.objects.filter(tenant__slug="acme").first()
    own = Job.objects.filter(tenant__slug="nimbus").first()
    log_in(page, server.url, "nimbus-viewer", PASSWORD)
    assert page.goto(f"{server.url}/jobs/{other.pk}/").status == 404
    assert page.goto(f"{server.url}/api/v1/jobs/{other.pk}/").status in (403, 404)
    assert page.goto(f"{server.url}/jobs/{own.pk}/").status == 200
    page.goto(f"{server.url}/")
    assert other.name not in page.content()
    screenshot(page, "tenant-home")


def test_screenshots_of_the_main_pages(page, server, world):
    log_in(page, server.url, world.username, PASSWORD)
    page.wait_for_selector(".heatmap .main-svg", timeout=10_000)
    screenshot(page, "provider-home")
    for path, name in [
        ("/faults/", "faults"),
        ("/whatif/", "whatif"),
        ("/scenarios/", "scenarios"),
        ("/audit/", "audit"),
        ("/tokens/", "tokens"),
    ]:
        response = page.goto(f"{server.url}{path}")
        assert response.status == 200, path
        screenshot(page, name)
    page.goto(f"{server.url}/whatif/")
    page.get_by_role("button", name="Run what-if").click()
    page.wait_for_url("**/whatif/*/")
    run_url = page.url
    from simulator.services.whatifs import whatif_execute

    whatif_execute(run_id=int(run_url.rstrip("/").split("/")[-1]))  # no worker in this test: run it here
    page.goto(run_url)
    page.wait_for_selector("#whatif-report table", timeout=5_000)
    screenshot(page, "whatif-report")


def test_home_figures_follow_completed_recoveries_live(page, chromium, server, world):
    from tenancy.models import Tenant

    nimbus = Tenant.objects.get(slug="nimbus")
    job = Job.objects.filter(tenant=nimbus).first()
    log_in(page, server.url, "nimbus-admin", PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    publish_in_a_thread(
        f"tenant-{nimbus.pk}",
        "actions.completed",
        {"actions": [{"job": job.pk, "job_state": "Running", "gpu_hours_saved": 12.5, "dry_run": False}]},
    )
    page.wait_for_function(
        "() => document.getElementById('fig-saved').textContent === '12.50'", timeout=5_000
    )
    assert page.locator(f"#tenant-jobs tr[data-job='{job.pk}'] .saved").inner_text() == "12.50"

    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    log_in(page, server.url, world.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    before = float(page.locator("#fig-saved-today").inner_text())
    publish_in_a_thread(
        "fleet",
        "actions.completed",
        {
            "actions": [
                {"job": job.pk, "gpu_hours_saved": 3.25, "dry_run": False},
                {"job": job.pk, "gpu_hours_saved": 99.0, "dry_run": True},
            ]
        },
    )
    page.wait_for_function(
        f"() => Number(document.getElementById('fig-saved-today').textContent) === {before + 3.25}",
        timeout=5_000,
    )
    context.close()


def test_why_is_this_job_slow_panel_names_the_fabric(page, server, world):
    from django.utils import timezone

    from telemetry.models import NICState

    job = Job.objects.filter(cluster__name="use-h100-a", state="Running").first()
    node = job.allocations.filter(released_at__isnull=True).first().node
    now = timezone.now()
    from fleet.models import NIC

    for nic in NIC.objects.filter(node__cluster=node.cluster):
        NICState.objects.create(
            nic=nic,
            node_id=nic.node_id,
            ts=now,
            link_state="up",
            symbol_rate=40_000.0 if (nic.node_id == node.pk and nic.name == "mlx5_2") else 3.0,
        )
    log_in(page, server.url, world.username, PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    page.get_by_role("button", name="Diagnose now").click()
    page.wait_for_function(
        "() => document.getElementById('diagnosis').dataset.fabric === 'yes'", timeout=5_000
    )
    assert f"{node.hostname}/mlx5_2" in page.locator("#diagnosis-summary").inner_text()
    screenshot(page, "job-diagnosis")
    page.goto(f"{server.url}/fabric/{node.cluster_id}/")
    assert page.locator("td.cell-bad").count() == 1
    screenshot(page, "fabric")


def test_fault_feed_page_shows_a_reported_fault_live(page, server, world):
    job = Job.objects.filter(cluster__name="use-h100-a", state="Running").first()
    node = job.allocations.filter(released_at__isnull=True).first().node
    log_in(page, server.url, world.username, PASSWORD)
    page.goto(f"{server.url}/faults/")
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    auth = {"Authorization": token_header(world, "write")["HTTP_AUTHORIZATION"]}
    requests.post(
        f"{server.url}/api/v1/faults/",
        json={"node": node.pk, "kind": "nic_down", "nic_name": "mlx5_4"},
        headers=auth,
        timeout=10,
    )
    page.locator("#fault-feed li", has_text="nic_down").first.wait_for(timeout=5_000)
