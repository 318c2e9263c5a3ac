"""The content security policy holds on every page: a real browser walks the pages a provider and a tenant user
reach from the navigation, following links to one page of every kind, and fails on any violation the browser
reports."""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model

from simulator.world import world_build
from tests.support.browser import log_in, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()

# Records every violation the page reports, from before its first script runs (init scripts are not subject to
# the page's policy).
LISTEN = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile}:${e.lineNumber}) ${e.sample}`);
});
"""
SKIP = ("/accounts/logout/", "/static/", "/metrics", "/healthz", "/readyz", "/api/schema/")
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


class Watcher:
    """Collects CSP violations from the securitypolicyviolation event and the console, page by page."""

    def __init__(self, page):
        self.page = page
        self.console: list[str] = []
        page.add_init_script(LISTEN)
        page.on(
            "console",
            lambda message: (
                self.console.append(message.text) if "Content Security Policy" in message.text else None
            ),
        )

    def visit(self, url: str) -> tuple[int, str, list[str]]:
        self.console.clear()
        response = self.page.goto(url)
        self.page.wait_for_load_state("load")
        self.page.wait_for_timeout(400)  # charts draw and live regions connect after load
        found = self.page.evaluate("() => window.__cspViolations || []")
        return response.status, response.headers.get("content-security-policy", ""), found + self.console

    def links(self, base: str) -> list[str]:
        hrefs = self.page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
        return [href for href in hrefs if href.startswith("/") and not href.startswith(SKIP)]


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


@pytest.mark.parametrize("username", ["lockstep-simulator", "nimbus-admin"])
def test_every_page_keeps_the_policy(page, server, world, username):
    log_in(page, server.url, username, PASSWORD)
    found, visited = walk(page, server.url)
    print(f"{username}: {len(visited)} pages checked: {' '.join(visited)}")
    assert found == {}


def test_admin_pages_keep_the_policy(page, server, world):
    admin = User.objects.get(username="lockstep-simulator")
    admin.is_staff = admin.is_superuser = True
    admin.save(update_fields=["is_staff", "is_superuser"])
    log_in(page, server.url, admin.username, PASSWORD)
    watcher = Watcher(page)
    found = {}
    for path in [
        "/admin/",
        "/admin/fleet/cluster/",
        f"/admin/fleet/cluster/{world_cluster_id()}/change/",
        "/admin/auth/user/add/",
    ]:
        status, _, violations = watcher.visit(f"{server.url}{path}")
        assert status == 200, path
        if violations:
            found[path] = violations
    assert found == {}


def world_cluster_id() -> int:
    from fleet.models import Cluster

    return Cluster.objects.order_by("pk").values_list("pk", flat=True).first()
