"""Banners and error pages in a real browser (issue 47, items 4 and 5), against a server run with DEBUG on as
``make run`` runs it: the holds on automation and maintenance show on the pages they govern, with who set them
and when (in the reader's time zone); a tenant sees them without the provider's names; 403 and 404 are the site's
own pages in its layout; unknown /api/ routes answer JSON. Screenshots go to test-artifacts/.

One server and one world serve the module; every test only reads."""

import json
import re

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.core.management import call_command

from controlplane.access import Role
from fleet.choices import AutomationMode
from fleet.models import Node
from fleet.services.automation import automation_switch_set
from fleet.services.clusters import cluster_update
from fleet.services.nodes import node_cordon
from tests.support.browser import SERVER_ENV, log_in, screenshot, usable_password
from tests.support.factories import make_cluster, make_fleet, make_tenant, make_user
from tests.support.jobs import bulk_nodes, submit

pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"
# live.js writes each <time> in the reader's zone in this format; the server writes UTC.
LOCAL_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")
AXE = Axe()


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """A fleet of acme's dedicated cluster and a shared one; the provider switch in dry run (by the admin), acme's
    cluster paused and the fleet's breaker tripped (both by the operator)."""
    with django_db_blocker.unblock():
        try:
            acme = make_tenant("acme")
            users = {
                "admin": make_user(Role.PROVIDER_ADMIN, username="admin-ada"),
                "operator": make_user(Role.OPERATOR, username="ops-otto"),
                "tenant": make_user(Role.TENANT_VIEWER, acme, username="acme-vera"),
            }
            for user in users.values():
                usable_password(user, PASSWORD)
            fleet = make_fleet("east", max_disrupted_percent=20)
            dedicated = make_cluster(fleet, "acme-gpu", dedicated_tenant=acme)
            shared = make_cluster(fleet, "shared-gpu")
            bulk_nodes(dedicated, 3, prefix="acme")
            bulk_nodes(shared, 3, prefix="shared")
            job = submit(dedicated, acme, gpus=8, name="acme-train")
            automation_switch_set(actor=users["admin"], mode=AutomationMode.DRY_RUN, reason="quarter close")
            cluster_update(actor=users["operator"], cluster=dedicated, automation=AutomationMode.PAUSED)
            tripping = Node.objects.filter(cluster=shared).order_by("hostname").first()
            node_cordon(actor=users["operator"], node=tripping, reason="xid 79")
        except BaseException:
            call_command("flush", interactive=False, verbosity=0)
            raise
    yield {"users": users, "cluster": dedicated.pk, "job": job.pk, "tripping": tripping.hostname}
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def live(world, tmp_path_factory):
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path_factory.mktemp("banners-errors"), **SERVER_ENV, DEBUG="true") as running:
        yield running


@pytest.fixture
def as_user(chromium, live, world):
    contexts = []

    def open_as(name: str):
        context = chromium.new_context(viewport={"width": 1440, "height": 900}, timezone_id="Asia/Tokyo")
        contexts.append(context)
        page = context.new_page()
        log_in(page, live.url, world["users"][name].username, PASSWORD)
        return page

    yield open_as
    for context in contexts:
        context.close()


def serious(page) -> list[str]:
    """axe-core's serious and critical findings on the page (as tests/browser/test_every_page.py checks)."""
    return [
        f"{v['id']}: {v['help']}"
        for v in AXE.run(page).response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def banner_texts(page) -> list[str]:
    return [" ".join(text.split()) for text in page.locator(".banners .banner").all_inner_texts()]


def test_the_provider_sees_every_hold_with_who_and_when(as_user, live, world):
    page = as_user("operator")
    page.goto(f"{live.url}/", wait_until="networkidle")
    (dry_run,) = banner_texts(page)
    assert dry_run.startswith("Automation in dry run everywhere") and "Set by admin-ada" in dry_run
    assert "Reason: quarter close" in dry_run
    moment = page.locator(".banners time").first
    assert LOCAL_TIME.fullmatch(moment.inner_text()) and moment.get_attribute("datetime").endswith("+00:00")
    assert page.locator(".banner-dry-run").evaluate("e => getComputedStyle(e).borderLeftWidth") == "6px"

    page.goto(f"{live.url}/clusters/{world['cluster']}/", wait_until="networkidle")
    found = banner_texts(page)
    assert page.locator(".banners .banner-title").all_inner_texts() == [
        "Automation in dry run everywhere",
        "Circuit breaker tripped on fleet east",
        "Automation paused on cluster acme-gpu",
    ], found
    assert f"Tripped by ops-otto (cordon of {world['tripping']})" in found[1]
    assert "Set by ops-otto" in found[2]
    assert page.locator(".banners time").count() == 3
    assert serious(page) == []
    screenshot(page, "banners-cluster")

    # The job's page is the cluster's too.
    page.goto(f"{live.url}/jobs/{world['job']}/", wait_until="networkidle")
    assert len(banner_texts(page)) == 3


def test_a_tenant_sees_the_holds_on_its_jobs_without_the_providers_names(as_user, live, world):
    page = as_user("tenant")
    page.goto(f"{live.url}/jobs/{world['job']}/", wait_until="networkidle")
    found = banner_texts(page)
    assert len(found) == 3 and all("by the provider" in line for line in found), found
    banners = page.locator(".banners").inner_text()
    for secret in ("admin-ada", "ops-otto", "quarter close", world["tripping"], "east", "of 6 nodes"):
        assert secret not in banners, secret
    screenshot(page, "banners-tenant-job")


def test_a_tenant_on_a_provider_page_gets_the_styled_403(as_user, live):
    page = as_user("tenant")
    response = page.goto(f"{live.url}/blueprints/", wait_until="networkidle")
    assert response.status == 403
    assert page.get_by_role("navigation", name="Main").is_visible()
    assert page.get_by_role("heading", level=1).inner_text() == "Not allowed"
    # The site's stylesheet dresses it (a card on the page's background), not a bare "403 Forbidden".
    assert page.locator(".error-page").evaluate("e => getComputedStyle(e).borderRadius") == "10px"
    assert page.locator(".banners .banner").count() == 1  # the provider switch governs every page
    assert serious(page) == []
    screenshot(page, "error-403")
    page.get_by_role("link", name="Go to the home page").click()
    page.wait_for_url(f"{live.url}/")


def test_an_unknown_page_is_the_styled_404_not_djangos_debug_page(as_user, live):
    page = as_user("operator")
    response = page.goto(f"{live.url}/no-such-page/", wait_until="networkidle")
    assert response.status == 404
    assert page.get_by_role("navigation", name="Main").is_visible()
    assert page.get_by_role("heading", level=1).inner_text() == "Page not found"
    assert "Using the URLconf" not in page.content()
    assert page.locator(".error-page").evaluate("e => getComputedStyle(e).borderRadius") == "10px"
    assert serious(page) == []
    screenshot(page, "error-404")
    # A missing object is the same page.
    assert page.goto(f"{live.url}/clusters/999999/").status == 404
    assert page.get_by_role("heading", level=1).inner_text() == "Page not found"


@pytest.mark.parametrize("path", ["/api/v1/no-such/", "/api/v1/clusters/abc/", "/api/nothing"])
def test_unknown_api_routes_answer_json(as_user, live, path):
    page = as_user("operator")
    response = page.request.get(f"{live.url}{path}")
    assert response.status == 404 and response.headers["content-type"] == "application/json"
    assert json.loads(response.text()) == {"detail": "Not found."}
    token = next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
    response = page.request.delete(f"{live.url}/api/v1/automation/", headers={"X-CSRFToken": token})
    assert response.status == 405 and response.headers["content-type"] == "application/json"
    assert "detail" in json.loads(response.text())
