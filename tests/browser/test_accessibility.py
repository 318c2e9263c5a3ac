"""Accessibility: axe-core (bundled with axe-playwright-python) finds no serious or critical violation on the
main pages, for a provider and a tenant user."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model

from controlplane.testing.browser import log_in, usable_password
from jobs.models import Job
from simulator.world import world_build

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


def violations(page) -> list[str]:
    results = Axe().run(page)
    return [f"{v['id']} ({v['impact']}): {v['help']} — {len(v['nodes'])} node(s), e.g. {v['nodes'][0]['target']}"
            for v in results.response["violations"] if v["impact"] in ("serious", "critical")]


@pytest.fixture
def world():
    world_build(seed=12, nodes_per_cluster=16, spares=2)
    for name in ("lockstep-simulator", "nimbus-admin"):
        usable_password(User.objects.get(username=name), PASSWORD)


def test_login_page_is_accessible(page, server, db):
    page.goto(f"{server.url}/accounts/login/")
    assert violations(page) == []


def test_provider_pages_are_accessible(page, server, world):
    log_in(page, server.url, "lockstep-simulator", PASSWORD)
    job = Job.objects.first()
    found = {}
    for path in ["/", "/jobs/", f"/jobs/{job.pk}/", "/faults/", "/whatif/", "/scenarios/", "/tokens/", "/audit/"]:
        page.goto(f"{server.url}{path}")
        page.wait_for_load_state("networkidle")
        problems = violations(page)
        if problems:
            found[path] = problems
    assert found == {}


def test_tenant_home_is_accessible(page, server, world):
    log_in(page, server.url, "nimbus-admin", PASSWORD)
    page.wait_for_load_state("networkidle")
    assert violations(page) == []
