"""Snapshot + events == a fresh snapshot, in a real browser against a live server, for the job page, the fault
overview and the provider home (the rollout page's is in tests/fleet/test_live_pages.py): each page is rendered,
real services write and publish while it is open, and once the page has applied their events its live parts
read as a freshly loaded page does."""

import threading
import time

import pytest
from django.db import connection

from jobs.models import RecoveryAction
from tests.support.browser import log_in, usable_password
from tests.support.jobs import protected_cluster, submit
from tests.support.slack import SLACK

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct-horse-9"
# What the page's live regions re-fetch needs to land after the last event (static/js/live.js waits 400 ms).
SETTLE_MS = 1_500


def in_a_thread(work) -> None:
    """Run services as a worker would: in a thread of its own, so their after-commit relay sends the events
    (Playwright's event loop owns this one)."""

    def run():
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)


def recover(node) -> None:
    """A fault on the node, handled and advanced as the worker and beat would, until its recoveries are over."""
    from jobs.services.advance import recovery_advance
    from jobs.services.faults import fault_handle, fault_ingest

    def work():
        fault, _ = fault_ingest(source="api", kind="node_unreachable", node=node)
        fault_handle(fault_id=fault.pk)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            recovery_advance()
            if (
                not RecoveryAction.objects.filter(fault=fault)
                .exclude(state__in=["succeeded", "failed", "cancelled", "superseded"])
                .exists()
            ):
                return
            time.sleep(0.2)

    in_a_thread(work)


def texts(page, selectors) -> dict[str, str]:
    return {selector: " ".join(page.locator(selector).inner_text().split()) for selector in selectors}


def settled(page, selectors, want: dict[str, str], seconds: float = 10) -> dict[str, str]:
    """The page's live parts once they read as ``want`` (a fresh render's), or as they read at the deadline: a
    loaded machine may deliver the last event, and the re-fetch it triggers, later than SETTLE_MS; a page that
    missed an event never reads as the fresh one does."""
    deadline = time.monotonic() + seconds * SLACK
    while (now := texts(page, selectors)) != want and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    return now


def fresh_page(page, url: str):
    fresh = page.context.new_page()
    fresh.goto(url)
    fresh.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    return fresh


@pytest.fixture
def operator(users):
    usable_password(users["operator"], PASSWORD)
    return users["operator"]


def test_job_page_after_live_events_equals_a_fresh_render(page, server, operator, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1)
    job = submit(cluster, tenant_a, gpus=16)
    node = job.allocations.filter(released_at__isnull=True).order_by("node__hostname").first().node
    log_in(page, server.url, operator.username, PASSWORD)
    url = f"{server.url}/jobs/{job.pk}/"
    page.goto(url)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    page.wait_for_function("() => document.getElementById('job-timeline').data !== undefined", timeout=10_000)
    assert page.locator("#action-table tr.empty-row").count() == 1

    recover(node)
    action = RecoveryAction.objects.filter(job=job).order_by("pk").last()
    assert action is not None
    page.wait_for_selector(
        f"#action-table tr[data-action='{action.pk}'][data-state='{action.state}']", timeout=10_000
    )
    page.wait_for_timeout(SETTLE_MS)
    regions = ("#job-state", "#gpu-hours-saved", "#job-incidents", "#job-actions")
    fresh = fresh_page(page, url)
    fresh.wait_for_function(
        "() => document.getElementById('job-timeline').data !== undefined", timeout=10_000
    )
    want = texts(fresh, regions)
    assert settled(page, regions, want) == want  # snapshot + events == a fresh snapshot
    faults = "() => document.getElementById('job-timeline').data[3].x.length"
    live_faults = page.evaluate(faults)
    assert fresh.evaluate(faults) == live_faults == 1
    fresh.close()


def test_fault_overview_after_live_events_equals_a_fresh_render(page, server, operator, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1)
    job = submit(cluster, tenant_a, gpus=16)
    node = job.allocations.filter(released_at__isnull=True).order_by("node__hostname").first().node
    log_in(page, server.url, operator.username, PASSWORD)
    url = f"{server.url}/faults/"
    page.goto(url)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#total-faults").inner_text() == "0"

    recover(node)
    page.wait_for_function(
        "() => document.getElementById('total-actions').textContent !== '0'", timeout=10_000
    )
    page.wait_for_timeout(SETTLE_MS)
    figures = ("#total-faults", "#total-actions", "#gpu-hours-saved", "#fault-feed")
    fresh = fresh_page(page, url)
    want = texts(fresh, figures)
    assert settled(page, figures, want) == want  # snapshot + events == a fresh snapshot
    rows = "() => [...document.querySelectorAll('#fault-feed > li')].map(li => li.dataset.incident || li.dataset.fault)"
    assert fresh.evaluate(rows) == page.evaluate(rows)
    fresh.close()


def test_provider_home_after_live_events_equals_a_fresh_render(page, server, operator):
    from fleet.services.nodes import node_cordon, node_mark_failed
    from jobs.services.faults import fault_ingest

    cluster = protected_cluster(nodes=16, spares=0)
    first, second = cluster.nodes.order_by("hostname")[2:4]
    log_in(page, server.url, operator.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    page.wait_for_selector(f"#heatmap-{cluster.pk} .main-svg", timeout=10_000)

    def work():
        node_cordon(actor=None, node=first, reason="quarantine: test")
        fault_ingest(source="api", kind="nic_down", node=second, nic_name="mlx5_1")
        node_mark_failed(actor=None, node=second, reason="test: it died")

    in_a_thread(work)
    cells = f"() => JSON.parse(document.getElementById('heatmap-{cluster.pk}').dataset.cells)"
    page.wait_for_function(f"() => ({cells})()[0][3] === -1", timeout=10_000)
    page.wait_for_function(
        "() => document.getElementById('fig-faults').textContent.trim() === '1'", timeout=10_000
    )
    page.wait_for_timeout(SETTLE_MS)
    parts = (
        "#fig-nodes-out",
        "#fig-gpus-healthy",
        "#fig-faults",
        "#fig-faults-open",
        "#fig-saved-today",
        "#fig-saved-30d",
        f"#heatmap-summary-{cluster.pk}",
    )
    fresh = fresh_page(page, f"{server.url}/")
    fresh.wait_for_selector(f"#heatmap-{cluster.pk} .main-svg", timeout=10_000)
    want = texts(fresh, parts)
    assert settled(page, parts, want) == want  # snapshot + events == a fresh snapshot
    live_cells = page.evaluate(cells)
    faults = "() => document.getElementById('chart-faults').data[0].y.reduce((a, b) => a + b, 0)"
    live_faults = page.evaluate(faults)
    assert fresh.evaluate(cells) == live_cells
    assert fresh.evaluate(faults) == live_faults == 1
    fresh.close()


def test_whatif_page_follows_its_run_to_the_report_as_a_fresh_render_shows_it(page, server, operator):
    from simulator.services.whatifs import whatif_execute, whatif_start

    run = whatif_start(actor=operator, config={"gpus": 1024, "days": 5})
    log_in(page, server.url, operator.username, PASSWORD)
    url = f"{server.url}/whatif/{run.pk}/"
    page.goto(url)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#whatif-report").is_hidden()

    in_a_thread(lambda: whatif_execute(run_id=run.pk))
    page.locator("#whatif-state", has_text="done").wait_for(timeout=10_000)
    page.wait_for_selector("#whatif-report table", timeout=10_000)
    page.wait_for_timeout(SETTLE_MS)
    live = texts(page, ("#whatif-live",))
    fresh = page.context.new_page()
    fresh.goto(url)
    assert texts(fresh, ("#whatif-live",)) == live  # snapshot + events == a fresh snapshot
    fresh.close()
