"""Working an incident in a real browser (issue 53): from the incident list to its page, acknowledged, assigned,
noted and resolved through the page's own forms, while a second browser on the same incident page sees each step
arrive live over the websocket. axe finds nothing serious on the list or on the incident page."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.access import Role
from controlplane.models import AuditEntry
from jobs.models import Incident
from tests.support.axe import axe_serious
from tests.support.browser import log_in, screenshot, usable_password
from tests.support.factories import make_tenant, make_user
from tests.support.incidents import incident_world

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"


@pytest.fixture
def watcher(chromium):
    """A second browser (its own context: its own session) for the same incident page."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def people() -> dict:
    users = {
        "operator": make_user(Role.OPERATOR, username="oncall-op", password=PASSWORD),
        "watcher": make_user(Role.PROVIDER_ADMIN, username="oncall-lead", password=PASSWORD),
    }
    for user in users.values():
        usable_password(user, PASSWORD)
    return users


def live_text(page, selector: str, text: str) -> None:
    """Wait until the element shows ``text`` (the page re-fetched its live regions after an event)."""
    page.wait_for_function(
        "([s, t]) => (document.querySelector(s) || {}).textContent?.includes(t)",
        arg=[selector, text],
        timeout=10_000,
    )


def fits_a_phone(page) -> bool:
    """At 390 px the page does not scroll sideways (its wide tables scroll inside their cards)."""
    size = page.viewport_size
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(50)
    extra = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    page.set_viewport_size(size)
    return extra <= 0


def test_an_incident_worked_from_the_list_is_seen_live_by_a_second_browser(page, watcher, server):
    acme, globex = make_tenant("Acme"), make_tenant("Globex")
    world = incident_world(acme, globex)
    incident = world.incidents["globex"]  # its recovery has ended: it may be resolved
    users = people()
    assignee = make_user(Role.TENANT_ADMIN, globex, username="globex-oncall")
    log_in(watcher, server.url, "oncall-lead", PASSWORD)
    watcher.goto(f"{server.url}/incidents/{incident.pk}/")
    watcher.wait_for_selector("#live-state[data-state='live']", timeout=10_000)

    log_in(page, server.url, "oncall-op", PASSWORD)
    page.goto(f"{server.url}/incidents/?work_state=new")
    assert page.locator("tr[data-incident]").count() == len(world.incidents)
    assert axe_serious(page) == [] and fits_a_phone(page)
    screenshot(page, "incident-list")
    page.locator(f"tr[data-incident='{incident.pk}'] a", has_text=f"#{incident.pk}").click()
    page.wait_for_url(f"{server.url}/incidents/{incident.pk}/")

    page.locator("#incident-acknowledge").click()
    page.wait_for_selector("#work-state[data-state='acknowledged']")
    live_text(watcher, "#work-state", "Acknowledged")
    live_text(watcher, "#incident-work-state", "Acknowledged")

    page.locator("#assign-user").select_option(label=assignee.username)
    page.locator("#incident-assign").click()
    page.wait_for_selector("#work-assignee:has-text('globex-oncall')")
    live_text(watcher, "#work-assignee", "globex-oncall")

    page.locator("#note-body").fill("Reseated **GPU 1**; <b>raw</b> HTML stays text.")
    page.locator("#incident-note").click()
    page.wait_for_selector("#incident-notes strong:has-text('GPU 1')")
    live_text(watcher, "#incident-notes", "Reseated")
    assert watcher.locator("#incident-notes strong", has_text="GPU 1").count() == 1
    assert watcher.locator("#incident-notes b").count() == 0

    page.get_by_label("Hardware (GPU, memory, board)").check()
    page.locator("#incident-resolve").click()
    page.wait_for_selector("#work-state[data-state='resolved']")
    live_text(watcher, "#work-resolved", "Hardware")
    live_text(watcher, "#incident-work-state", "Resolved by a person")
    # The page as anyone opens it (a step's one-time message is base.html's, checked with it elsewhere).
    page.goto(f"{server.url}/incidents/{incident.pk}/")
    assert axe_serious(page) == [] and fits_a_phone(page)
    assert axe_serious(watcher) == []  # the same page re-rendered live, four times over
    screenshot(page, "incident-worked")

    page.locator("#incident-reopen").click()
    page.wait_for_selector("#work-state[data-state='acknowledged']")
    assert axe_serious(page, "#incident-work") == []  # the card with its assign and resolve forms again
    worked = Incident.objects.get(pk=incident.pk)
    assert worked.work_state == "acknowledged" and worked.assignee_id == assignee.pk
    steps = AuditEntry.objects.filter(object_type="jobs.incident", actor=users["operator"]).values_list(
        "action", flat=True
    )
    assert sorted(steps) == sorted(
        ["incident.acknowledge", "incident.assign", "incident.note", "incident.resolve", "incident.reopen"]
    )
    assert get_user_model().objects.filter(username="oncall-op").exists()
