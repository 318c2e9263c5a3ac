"""Live everywhere it shows state (issue 23), in a real browser against a live server: the job page's Recovery
actions table follows the job's events, the home heat map turns when a node fails, the home's Live events panel
opens with its history, and only live pages show the connection badge. Each live result is checked against a
fresh load of the page (snapshot + events == a fresh snapshot)."""

import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from controlplane import events
from jobs.choices import ActionState
from jobs.models import RecoveryAction
from jobs.services.publishing import action_payload
from tests.support.browser import log_in, usable_password
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"


def in_a_thread(work) -> None:
    """Run a write as a service would, from a thread without the browser's event loop (so the relay sends)."""

    def run():
        try:
            with transaction.atomic():
                work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


@pytest.fixture
def operator(users):
    usable_password(users["operator"], PASSWORD)
    return users["operator"]


def _rows(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(
        selector, "rows => rows.map(r => r.innerText.replace(/\\s+/g, ' ').trim())"
    )


def test_recovery_actions_table_follows_the_job_live(page, server, operator, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1)
    job = submit(cluster, tenant_a, gpus=16)
    log_in(page, server.url, operator.username, PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#action-table tr.empty-row").count() == 1
    now = timezone.now()
    action = RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind="live_migration",
        state=ActionState.RUNNING,
        detected_at=now,
        planned_at=now,
        started_at=now,
        gpus=16,
        reason="worker moved to a spare",
    )

    def decided():
        payload = {**action_payload(action), "event": "action.started"}
        events.publish([f"job-{job.pk}"], "actions.decided", {"actions": [payload], "summary": "1 decided"})

    in_a_thread(decided)
    page.wait_for_selector(
        f"#action-table tr[data-action='{action.pk}'][data-state='running']", timeout=5_000
    )
    assert page.locator("#action-table tr.empty-row").count() == 0

    RecoveryAction.objects.filter(pk=action.pk).update(
        state=ActionState.SUCCEEDED, ended_at=timezone.now(), pause_seconds=1234.5, gpu_hours_saved=2595014.2
    )
    action.refresh_from_db()

    def completed():
        payload = {
            **action_payload(action),
            "event": "action.succeeded",
            "job_state": "Running",
            "iteration": 10,
            "at": action.ended_at.isoformat(),
        }
        events.publish(
            [f"job-{job.pk}"], "actions.completed", {"actions": [payload], "summary": "1 completed"}
        )

    in_a_thread(completed)
    page.wait_for_selector(
        f"#action-table tr[data-action='{action.pk}'][data-state='succeeded']", timeout=5_000
    )
    live = _rows(page, "#action-table tbody tr")
    assert len(live) == 1 and "1,234.5" in live[0] and "2,595,014.20" in live[0]
    page.reload()
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert _rows(page, "#action-table tbody tr") == live


def test_home_heat_map_turns_when_a_node_fails(page, server, operator):
    from fleet.services.nodes import node_cordon, node_mark_failed

    cluster = protected_cluster(nodes=16, spares=0)
    node = cluster.nodes.order_by("hostname")[3]
    log_in(page, server.url, operator.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    page.wait_for_selector(f"#heatmap-{cluster.pk} .main-svg", timeout=10_000)
    cells = f"() => JSON.parse(document.getElementById('heatmap-{cluster.pk}').dataset.cells)"
    assert page.evaluate(cells)[0][3] == 0
    healthy = page.locator("#fig-gpus-healthy").inner_text()
    assert healthy == "128"

    # quarantined first (cordoned: out of service, grey), then failed (red), as the escalation ladder does
    in_a_thread(lambda: node_cordon(actor=None, node=node, reason="quarantine: test"))
    page.wait_for_function(f"() => ({cells})()[0][3] === -2", timeout=5_000)
    assert page.locator("#fig-nodes-out").inner_text() == "1"
    in_a_thread(lambda: node_mark_failed(actor=None, node=node, reason="test: it died"))
    page.wait_for_function(f"() => ({cells})()[0][3] === -1", timeout=5_000)
    assert page.locator("#fig-gpus-healthy").inner_text() == "120"
    assert page.locator("#fig-nodes-out").inner_text() == "1"
    live = page.evaluate(cells)
    page.reload()
    page.wait_for_selector(f"#heatmap-{cluster.pk} .main-svg", timeout=10_000)
    assert page.evaluate(cells) == live and page.locator("#fig-gpus-healthy").inner_text() == "120"


def test_home_live_events_open_with_history_then_follow(page, server, operator):
    def earlier():
        for i in range(3):
            events.publish(
                ["fleet"], "node.cordoned", {"node": 900 + i, "hostname": f"old-{i}", "state": "cordoned"}
            )

    in_a_thread(earlier)
    log_in(page, server.url, operator.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    history = _rows(page, "#event-feed li[data-seq]")
    assert [line.split(" ")[-1] for line in history] == ["old-2", "old-1", "old-0"]
    assert page.locator("#event-feed li.empty").count() == 0
    in_a_thread(
        lambda: events.publish(
            ["fleet"], "node.cordoned", {"node": 999, "hostname": "new-one", "state": "cordoned"}
        )
    )
    page.wait_for_function(
        "() => document.querySelectorAll('#event-feed li[data-seq]').length === 4", timeout=5_000
    )
    assert _rows(page, "#event-feed li[data-seq]")[0].endswith("new-one")
    # the live line is written as the history's are: one date format
    assert page.evaluate(
        "() => /^\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d$/.test("
        "document.querySelector('#event-feed li time').textContent)"
    )


def test_only_live_pages_show_the_connection_badge(page, server, operator):
    log_in(page, server.url, operator.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#live-state").is_visible()
    for path in ("/tokens/", "/audit/", "/predictions/"):
        page.goto(f"{server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert not page.locator("#live-state").is_visible(), path
        assert "offline" not in page.locator("header").inner_text(), path


def test_charts_step_on_drops_and_count_from_zero(page, server, operator, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1)
    job = submit(cluster, tenant_a, gpus=16)
    now = timezone.now()
    RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        kind="live_migration",
        state=ActionState.SUCCEEDED,
        detected_at=now,
        started_at=now,
        ended_at=now,
        gpus=16,
        gpu_hours_saved=30.0,
    )
    log_in(page, server.url, operator.username, PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    page.wait_for_function(
        "() => document.getElementById('job-iterations').data !== undefined", timeout=10_000
    )
    shapes = page.evaluate("() => document.getElementById('job-iterations').data.map(t => t.line.shape)")
    assert shapes == ["hv", "hv"]  # a restart's drop is a step, not a slope
    page.goto(f"{server.url}/faults/")
    page.wait_for_function(
        "() => document.getElementById('saved-chart')._fullLayout !== undefined", timeout=10_000
    )
    assert page.evaluate("() => document.getElementById('saved-chart')._fullLayout.yaxis.range[0]") == 0
    page.goto(f"{server.url}/")
    page.wait_for_selector("#chart-saved .main-svg", timeout=10_000)
    assert page.locator("#chart-faults-empty").is_visible() and not page.locator("#chart-faults").is_visible()


def test_incidents_table_lists_an_incident_once_the_job_acts_on_it(page, server, operator, tenant_a):
    from jobs.models import FaultEvent
    from jobs.services.faults import fault_ingest

    cluster = protected_cluster(nodes=4, spares=1)
    job = submit(cluster, tenant_a, gpus=16)
    node = job.allocations.filter(released_at__isnull=True).first().node
    log_in(page, server.url, operator.username, PASSWORD)
    page.goto(f"{server.url}/jobs/{job.pk}/")
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator("#incident-table tr.empty-row").count() == 1
    in_a_thread(lambda: fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_0"))
    fault = FaultEvent.objects.select_related("node").get(node=node)
    page.wait_for_function(
        "() => document.getElementById('job-timeline').data[3].x.length === 1", timeout=5_000
    )
    assert page.locator("#incident-table tr.empty-row").count() == 1  # no attempt yet: not listed
    now = timezone.now()
    action = RecoveryAction.objects.create(
        job=job,
        cluster=cluster,
        fault=fault,
        incident_id=fault.incident_id,
        node=node,
        kind="nic_failover",
        state=ActionState.RUNNING,
        detected_at=now,
        planned_at=now,
        started_at=now,
        gpus=16,
    )

    def decided():
        payload = {**action_payload(action), "event": "action.started"}
        events.publish([f"job-{job.pk}"], "actions.decided", {"actions": [payload], "summary": "1 decided"})

    in_a_thread(decided)
    row = f"#incident-table tr[data-incident='{fault.incident_id}']"
    page.wait_for_selector(f"{row} li[data-action='{action.pk}']", timeout=5_000)
    assert page.locator(f"{row} li[data-action='{action.pk}'] .state").inner_text() == "running"
    assert page.locator(f"{row} .report-count").inner_text() == "1"
    page.reload()
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.locator(f"{row} li[data-action='{action.pk}'] .state").inner_text() == "running"
    assert page.locator("#incident-table tbody tr").count() == 1


def test_tenant_home_job_counts_follow_job_states_live(page, server, users, tenant_a):
    """The tenant home's "Jobs running" and "recovering" figures move with each job's change of state, and what
    they show live is what a fresh load shows."""
    from jobs.services.publishing import publish_job

    cluster = protected_cluster(nodes=4, spares=1)
    first = submit(cluster, tenant_a, gpus=8, name="one")
    submit(cluster, tenant_a, gpus=8, name="two")
    viewer = users["tenant-viewer"]
    usable_password(viewer, PASSWORD)
    log_in(page, server.url, viewer.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    figures = "() => [document.querySelector('#fig-running').textContent, document.querySelector('#fig-recovering').textContent]"
    assert page.evaluate(figures) == ["2", "0"]

    def recovering():
        from jobs.choices import JobState
        from jobs.models import Job

        Job.objects.filter(pk=first.pk).update(state=JobState.RECOVERING)
        publish_job(Job.objects.get(pk=first.pk), "job.state")

    in_a_thread(recovering)
    page.wait_for_function(f"() => ({figures})().join() === '1,1'", timeout=5_000)
    in_a_thread(recovering)  # the same state again moves nothing
    page.wait_for_timeout(500)
    assert page.evaluate(figures) == ["1", "1"]
    assert page.locator(f"#tenant-jobs tr[data-job='{first.pk}'] .state").inner_text() == "Recovering"
    page.reload()
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    assert page.evaluate(figures)[0] == "1"
