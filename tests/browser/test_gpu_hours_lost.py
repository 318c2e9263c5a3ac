"""GPU-hours lost in a real browser (issue 47): the provider home draws saved and lost as two cumulative lines, and
the lost figures on both homes follow completed recoveries live, as the saved ones do."""

import pytest
from django.contrib.auth import get_user_model

from jobs.models import Job
from simulator.world import world_build
from tests.support.browser import log_in, publish_in_a_thread, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


@pytest.fixture
def world():
    world_build(seed=3, nodes_per_cluster=8, spares=2)
    for name in ("lockstep-simulator", "nimbus-admin"):
        usable_password(User.objects.get(username=name), PASSWORD)
    return User.objects.get(username="lockstep-simulator")


def number(page, selector: str) -> float:
    return float(page.locator(selector).inner_text().replace(",", ""))


def test_lost_follows_completed_recoveries_on_both_homes(page, chromium, server, world):
    job = Job.objects.filter(tenant__slug="nimbus").first()
    log_in(page, server.url, world.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    before = number(page, "#fig-lost-today"), number(page, "#fig-lost-30d")
    completed = {
        "actions": [
            {
                "job": job.pk,
                "job_state": "Running",
                "gpu_hours_saved": 0,
                "gpu_hours_lost": 2.5,
                "dry_run": False,
            },
            {
                "job": job.pk,
                "job_state": "Running",
                "gpu_hours_saved": 9,
                "gpu_hours_lost": 40,
                "dry_run": True,
            },
        ]
    }
    publish_in_a_thread("fleet", "actions.completed", completed)
    page.wait_for_function(
        f"() => Number(document.getElementById('fig-lost-today').textContent) === {before[0] + 2.5}",
        timeout=5_000,
    )
    assert number(page, "#fig-lost-30d") == before[1] + 2.5
    # a restart saves nothing and still draws the chart: saved flat, lost rising
    page.wait_for_selector("#chart-saved .main-svg", timeout=5_000)
    traces = page.evaluate(
        "() => document.getElementById('chart-saved').data.map(t => [t.name, t.y[t.y.length - 1]])"
    )
    assert traces[0][0] == "saved" and traces[1] == ["lost", before[1] + 2.5]

    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    tenant = context.new_page()
    try:
        log_in(tenant, server.url, "nimbus-admin", PASSWORD)
        tenant.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
        shown = number(tenant, "#fig-lost")
        row = f"#tenant-jobs tr[data-job='{job.pk}'] .lost"
        in_row = number(tenant, row)
        publish_in_a_thread(f"tenant-{job.tenant_id}", "actions.completed", completed)
        tenant.wait_for_function(
            f"() => Number(document.getElementById('fig-lost').textContent) === {shown + 2.5}", timeout=5_000
        )
        assert number(tenant, row) == in_row + 2.5
    finally:
        context.close()
