"""Every page, as each role of DESIGN's permission table: axe-core (bundled with axe-playwright-python) finds no
serious or critical violation at 1,440 px, and at 390 px (a phone) the page does not scroll sideways.

The pages are the root URLconf's, as the isolation matrix declares them (tests/support/matrix.py): every
pattern that is not the API's or the admin's and answers a GET with a page the role may read, its object
chosen from the matrix's world as one the role may see. A page added to the matrix is walked here too. The
world is built once for the module and one server and one browser serve every role.
"""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.core.management import call_command
from django.urls import reverse

from controlplane.timerange import RANGES
from tests.support.browser import log_in, screenshot, usable_password
from tests.support.matrix import ROUTES, Who, matrix_world_build, url_patterns

# The world is committed once for the module (the server reads it); each test only reads it.
pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"
# DESIGN's roles, each as one user of the world (tenant roles of acme).
ROLES = {
    "provider-admin": "provider-admin",
    "operator": "operator",
    "tenant-admin": "acme-admin",
    "tenant-viewer": "acme-viewer",
}
# Patterns that answer a GET with something other than a page of Lockstep's (probes, exposition, the schema),
# or that sign the reader out.
NOT_PAGES = {"healthz", "readyz", "metrics", "schema", "logout", "login"}
# Parameters of patterns that are not object ids.
QUERIES = {"search": "?q=gpu"}
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}
AXE = Axe()


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        try:
            built = matrix_world_build()
            for user in built.users.values():
                usable_password(user, PASSWORD)
        except BaseException:
            call_command("flush", interactive=False, verbosity=0)
            raise
    yield built
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def live(world, tmp_path_factory):
    """One server for the module (the world is committed before it starts)."""
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path_factory.mktemp("every-page"), **SERVER_ENV) as running:
        yield running


def pages_for(world, who: Who) -> list[str]:
    """The URL of every page the role may read: one per pattern, its object one the role may see (its own
    tenant's before the provider's)."""
    urls = []
    for pattern in url_patterns():
        if pattern.is_api or pattern.is_admin or pattern.key in NOT_PAGES:
            continue
        route = ROUTES[pattern.key]
        policy = route.methods.get("GET")
        if policy is None:
            continue
        ids = [name for name in pattern.params if name in ("pk", "cluster_id")]
        if not ids:
            if policy(who, None, "GET") == 200:
                urls.append(reverse(pattern.name, kwargs=route.values) + QUERIES.get(pattern.key, ""))
            continue
        candidates = sorted(world.objects[route.fill], key=lambda row: row[0] != who.tenant)
        for owner, pk in candidates:
            if policy(who, owner, "GET") == 200:
                urls.append(reverse(pattern.name, kwargs={**route.values, **{name: pk for name in ids}}))
                break
    return urls


def serious(page) -> list[str]:
    results = AXE.run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {len(v['nodes'])} node(s), e.g. "
        + "; ".join(
            str(node["target"]) + " " + node.get("failureSummary", "")[:160] for node in v["nodes"][:3]
        )
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def sideways(page) -> int:
    """How many CSS pixels the page is wider than the viewport (0: no horizontal scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


@pytest.mark.parametrize("role", ROLES)
def test_every_page_is_accessible_and_fits_a_phone(role, world, live, chromium):
    who = Who(ROLES[role])
    urls = pages_for(world, who)
    # Provider roles read every page family; tenants the fleet, jobs and faults pages of their own.
    assert len(urls) >= (20 if who.provider else 12), urls
    context = chromium.new_context(viewport=DESKTOP, timezone_id="Europe/Berlin")
    page = context.new_page()
    found: dict[str, list[str]] = {}
    try:
        log_in(page, live.url, world.users[ROLES[role]].username, PASSWORD)
        for url in urls:
            page.set_viewport_size(DESKTOP)
            response = page.goto(f"{live.url}{url}", wait_until="networkidle")
            assert response.status == 200, f"{url} as {role}: {response.status}"
            if url.startswith("/whatif/") and url != "/whatif/":
                # The world's what-if ran to the end: its report (and the sensitivity table) is what axe reads.
                assert page.locator("text=Effective training time").count() > 0, url
            problems = serious(page)
            page.set_viewport_size(PHONE)
            page.wait_for_timeout(50)  # charts redraw on resize
            extra = sideways(page)
            if extra > 0:
                screenshot(page, f"phone-{role}-{url.strip('/').replace('/', '-') or 'home'}")
                problems.append(f"{extra} px of horizontal scroll at {PHONE['width']} px")
            if problems:
                found[url] = problems
    finally:
        context.close()
    assert found == {}, "\n".join(
        f"{url}: {problem}" for url, problems in found.items() for problem in problems
    )


def test_the_time_range_is_remembered_per_page(world, live, chromium):
    context = chromium.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        log_in(page, live.url, world.users["operator"].username, PASSWORD)
        page.goto(f"{live.url}/faults/")
        assert page.locator("[data-time-range]").get_attribute("data-time-range") == "30d"
        page.get_by_role("link", name="last 6 h").click()
        page.wait_for_url("**/faults/?range=6h")
        assert page.locator(".time-range a[aria-current]").inner_text().strip().endswith("6 h")
        # Back on the page without a range: the one chosen here, asked for again.
        page.goto(f"{live.url}/faults/")
        page.wait_for_url("**/faults/?range=6h")
        assert page.locator("[data-time-range]").get_attribute("data-time-range") == "6h"
        # Another page keeps its own (its default until one is chosen there: a new fleet's first hour).
        page.goto(f"{live.url}/")
        page.wait_for_load_state("networkidle")
        assert (
            page.url == f"{live.url}/"
            and page.locator("[data-time-range]").get_attribute("data-time-range") == "1h"
        )
        # The job page, once scrolling sideways on a phone, and its picker there.
        page.set_viewport_size(PHONE)
        page.goto(f"{live.url}/jobs/{world.objects['job'][0][1]}/", wait_until="networkidle")
        assert sideways(page) == 0 and page.locator(".time-range a").count() == len(RANGES)
        screenshot(page, "job-page-phone")
    finally:
        context.close()


def test_the_audit_trail_fits_the_screen_a_line_a_write(world, live, chromium):
    context = chromium.new_context(viewport=DESKTOP)
    page = context.new_page()
    try:
        log_in(page, live.url, world.users["operator"].username, PASSWORD)
        page.goto(f"{live.url}/audit/")
        assert sideways(page) == 0
        rows = page.locator(".audit-table tbody tr")
        assert rows.count() >= 20
        heights = page.evaluate(
            "() => [...document.querySelectorAll('.audit-table tbody tr')].map(r => r.getBoundingClientRect().height)"
        )
        assert max(heights) < 48, heights  # one line each: the change is folded
        assert page.locator(".audit-change[open]").count() == 0
        first = page.locator(".audit-change").first
        first.locator("summary").click()
        assert first.get_attribute("open") is not None and first.locator("pre").is_visible()
        assert sideways(page) == 0
        screenshot(page, "audit-trail")
        # Pickers of names: choosing an actor filters by it.
        actor = world.users["provider-admin"].username
        page.get_by_label("Who").select_option(actor)
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(f"**actor={actor}**")
        who = page.evaluate(
            "() => [...document.querySelectorAll('.audit-table tbody td:nth-child(2)')]"
            ".map(td => td.textContent.trim().split(' ')[0])"
        )
        assert who and set(who) == {actor}
    finally:
        context.close()
