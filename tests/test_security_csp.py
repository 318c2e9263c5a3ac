"""The content security policy holds on every page: a real browser walks the pages a provider and a tenant user
reach from the navigation, following links to one page of every kind, and fails on any violation the browser
reports."""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from simulator.world import world_build
from tests.support.browser import Watcher, log_in, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()

MOST_PAGES = 60


def shape(path: str) -> str:
    """Pages of one kind share a shape: /jobs/17/ and /jobs/18/ are both /jobs/N/."""
    return re.sub(r"/\d+(?=/|$)", "/N", path)


@pytest.fixture
def world():
    """The demo world, with a finished what-if run and an ab-nic scenario, so their pages exist too."""
    from simulator.services.scenarios import abnic_start
    from simulator.services.whatifs import whatif_execute, whatif_start

    world_build(seed=13, nodes_per_cluster=8, spares=2)
    admin = User.objects.get(username="lockstep-simulator")
    whatif_execute(run_id=whatif_start(actor=admin, config={}).pk)
    abnic_start(actor=admin, gpus=8)
    for name in ("lockstep-simulator", "nimbus-admin"):
        usable_password(User.objects.get(username=name), PASSWORD)


def walk(page, base: str) -> tuple[dict[str, list[str]], list[str]]:
    """Visit the navigation's pages and, following links, one page of each kind: the violations found, by path,
    and the paths visited."""
    watcher = Watcher(page)
    page.goto(f"{base}/")
    nav = page.eval_on_selector_all(
        "nav[aria-label='Main'] a[href]", "els => els.map(e => e.getAttribute('href'))"
    )
    queue = ["/", *nav]
    seen_shapes: set[str] = set()
    found: dict[str, list[str]] = {}
    visited: list[str] = []
    while queue and len(visited) < MOST_PAGES:
        path = queue.pop(0)
        if shape(urlsplit(path).path) in seen_shapes:
            continue
        seen_shapes.add(shape(urlsplit(path).path))
        status, policy, violations = watcher.visit(f"{base}{path}")
        visited.append(path)
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, (path, policy)
        if violations:
            found[path] = violations
        if status == 200:
            queue.extend(watcher.links(base))
    assert set(nav) <= set(visited), "the walk missed a page of the navigation"
    return found, visited


def test_the_detector_sees_a_violation(page, server, db):
    watcher = Watcher(page)
    watcher.visit(f"{server.url}/accounts/login/")
    page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.x = 1'; document.body.appendChild(s); }"
    )
    page.wait_for_timeout(200)
    assert any("script-src" in found for found in page.evaluate("() => window.__cspViolations"))


def test_login_page_keeps_the_policy(page, server, db):
    status, policy, violations = Watcher(page).visit(f"{server.url}/accounts/login/")
    assert status == 200 and violations == []
    assert (
        "default-src 'self'" in policy
        and "object-src 'none'" in policy
        and "frame-ancestors 'none'" in policy
    )


def test_every_page_and_the_admin_keep_the_policy(page, server, world):
    """A provider and a tenant walk their pages, then the admin's pages; one world for all three (it is the
    costly part: a demo world, a what-if run and a scenario)."""
    for username in ("lockstep-simulator", "nimbus-admin"):
        page.context.clear_cookies()
        log_in(page, server.url, username, PASSWORD)
        found, visited = walk(page, server.url)
        print(f"{username}: {len(visited)} pages checked: {' '.join(visited)}")
        assert found == {}, username
    admin = User.objects.get(username="lockstep-simulator")
    admin.is_staff = admin.is_superuser = True
    admin.save(update_fields=["is_staff", "is_superuser"])
    page.context.clear_cookies()
    log_in(page, server.url, admin.username, PASSWORD)
    watcher = Watcher(page)
    found = {}
    for path in [
        "/admin/",
        "/admin/fleet/cluster/",
        f"/admin/fleet/cluster/{world_cluster_id()}/change/",
        f"/admin/auth/user/{admin.pk}/change/",  # read-only: users change through the services
    ]:
        status, _, violations = watcher.visit(f"{server.url}{path}")
        assert status == 200, path
        if violations:
            found[path] = violations
    assert found == {}


def world_cluster_id() -> int:
    from fleet.models import Cluster

    return Cluster.objects.order_by("pk").values_list("pk", flat=True).first()
