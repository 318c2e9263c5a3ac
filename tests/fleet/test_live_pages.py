"""The rollout page in a real browser (Chromium through Playwright, a live uvicorn, the real websocket): progress
appears live as steps are taken, the page after events equals a freshly loaded page, and the operator buttons work."""

import pytest

from fleet.choices import RolloutState
from fleet.models import Rollout
from fleet.services.blueprints import version_create
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_start
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.browser import log_in, screenshot, usable_password

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-9"


def in_worker_thread(function, **kwargs):
    """Run a service as a worker would: in a thread of its own (Playwright's event loop owns this one, and the
    after-commit relay must not run inside it)."""
    import threading

    from django.db import connection

    def run():
        try:
            function(**kwargs)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)


def test_rollout_progress_arrives_live_and_matches_a_fresh_page(page, server, users):
    operator = users["operator"]
    bp, v1 = blueprint(operator, auto_rollout=False)
    clusters_on(v1, 4)
    v2 = version_create(
        actor=operator, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=operator,
        version=v2,
        targets={"tracking": True},
        strategy={"batch_size": 2, "soak_seconds": 3600},
    )
    usable_password(operator, PASSWORD)
    log_in(page, server.url, operator.username, PASSWORD)
    url = f"{server.url}/rollouts/{rollout.pk}/"
    page.goto(url)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#rollout-state").inner_text() == "Pending"

    in_worker_thread(
        rollout_step, rollout_id=rollout.pk
    )  # batch 0: two clusters applied, healthy at once, soaking
    page.locator("#rollout-state", has_text="Running").wait_for(timeout=10_000)
    page.locator("#rollout-batches td", has_text="Soaking").wait_for(timeout=10_000)
    page.locator("#rollout-clusters tr.row-Succeeded").nth(1).wait_for(timeout=10_000)
    page.locator("#fleet-feed li", has_text="rollout.batch_soaking").wait_for(timeout=10_000)
    live = {region: page.locator(region).inner_text() for region in ("#rollout-batches", "#rollout-clusters")}
    fresh = page.context.new_page()
    fresh.goto(url)
    assert {
        region: fresh.locator(region).inner_text() for region in live
    } == live  # snapshot + events == snapshot
    fresh.close()

    page.fill("#reason-pause", "checking the canary")
    page.click("button[data-action='pause']")
    page.locator("#rollout-state", has_text="Paused").wait_for(timeout=10_000)
    assert Rollout.objects.get(pk=rollout.pk).state == RolloutState.PAUSED
    assert "checking the canary" in page.content()
    page.click("button[data-action='rollback']")
    page.click("#confirm-yes")  # rolling back asks first
    page.locator("#rollout-state", has_text="RolledBack").wait_for(timeout=10_000)
    screenshot(page, "fleet-rollout-rolled-back")


def test_fleet_pages_render_in_a_browser(page, server, users, tenant_a):
    from fleet.drivers.simulated import simulate_drift
    from fleet.services.drift import drift_sweep
    from tests.support.factories import make_node

    operator = users["operator"]
    bp, v1 = blueprint(operator, auto_rollout=False, node_software={"cuda": "12.4"})
    clusters = clusters_on(v1, 3, dedicated_tenant=tenant_a)
    for cluster in clusters:
        make_node(cluster)
    simulate_drift(clusters[0], addon="nic-failover", kind="values")
    version_create(actor=operator, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True)
    in_worker_thread(drift_sweep)
    usable_password(operator, PASSWORD)
    log_in(page, server.url, operator.username, PASSWORD)
    page.goto(f"{server.url}/fleet/")
    assert page.locator("#fleet-clusters tbody tr").count() == 3
    screenshot(page, "fleet-overview")
    page.goto(f"{server.url}/clusters/{clusters[0].pk}/")
    page.locator("#cluster-drift td", has_text="Values changed").wait_for(timeout=5_000)
    screenshot(page, "fleet-cluster")
    page.goto(f"{server.url}/blueprints/{bp.pk}/?from=1&to=2")
    page.locator("li", has_text="gpu-operator").first.wait_for(timeout=5_000)
    screenshot(page, "fleet-blueprint")
