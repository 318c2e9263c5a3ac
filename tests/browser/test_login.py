"""Log in as each role in a real browser; the page goes live over the websocket and shows events as they happen."""

import re

import pytest
import requests

from tests.support.browser import log_in, screenshot, usable_password
from tests.support.factories import token_header

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct-horse-9"


@pytest.mark.parametrize("role", ["provider-admin", "operator", "tenant-admin", "tenant-viewer"])
def test_each_role_logs_in_and_the_page_goes_live(page, server, users, role):
    usable_password(users[role], PASSWORD)
    log_in(page, server.url, users[role].username, PASSWORD)
    badge = page.locator(".who .badge")
    assert badge.inner_text() == role
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    nav = page.get_by_role("navigation", name="Main")
    assert ("Audit" in nav.inner_text()) is (role in ("provider-admin", "operator"))
    screenshot(page, f"home-{role}")


def test_wrong_password_stays_on_login(page, server, users):
    page.goto(f"{server.url}/accounts/login/")
    page.get_by_label("User name").fill(users["operator"].username)
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    assert page.get_by_role("alert").inner_text().startswith("Your user name and password did not match")
    screenshot(page, "login-error")


def test_event_appears_live_and_is_caught_up_after_a_reconnect(page, server, users):
    admin = users["provider-admin"]
    auth = {"Authorization": token_header(admin, "write")["HTTP_AUTHORIZATION"]}
    usable_password(admin, PASSWORD)
    log_in(page, server.url, admin.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    requests.post(
        f"{server.url}/api/v1/tenants/",
        json={"name": "Live One", "slug": "live-one"},
        headers=auth,
        timeout=10,
    )
    page.locator("#event-feed li", has_text="Live One").wait_for(timeout=5_000)

    # The websocket drops and stays away for 3 s; an event happens meanwhile and can only come back
    # through the catch-up fetch after the reconnect.
    page.evaluate(
        "() => { const live = window.LockstepLive.current; live.backoff = 3000; live.socket.close(); }"
    )
    page.wait_for_selector("#live-state[data-state='reconnecting']", timeout=2_000)
    requests.post(
        f"{server.url}/api/v1/tenants/",
        json={"name": "While Away", "slug": "while-away"},
        headers=auth,
        timeout=10,
    )
    assert page.locator("#event-feed li", has_text="While Away").count() == 0
    page.locator("#event-feed li", has_text="While Away").wait_for(timeout=15_000)
    items = page.locator("#event-feed li").all_inner_texts()
    assert sum(bool(re.search("While Away", item)) for item in items) == 1
    screenshot(page, "home-live-feed")
