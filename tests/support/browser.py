"""Headless Chromium driven by Playwright: Debian's /usr/bin/chromium, kept off the network.

Playwright's own browser download does not work here, so the suite uses the distribution's Chromium with
the flags that stop it from calling home. Screenshots go to test-artifacts/.
"""

import os
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

CHROMIUM = os.environ.get("LOCKSTEP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ARTIFACTS = Path(settings.BASE_DIR) / "test-artifacts"
# For the servers browser tests run: they log the same users in many times a minute, and the login limits (5 per
# user and address a minute by default) would refuse the sixth. The limits have tests of their own
# (tests/test_security_ratelimit.py).
SERVER_ENV = {"LOGIN_RATE": "1000/min", "LOGIN_ADDRESS_RATE": "1000/min"}


@contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot as a test artefact. Headless Chromium now and then refuses a full-page
    capture ("Unable to capture screenshot"); then the visible viewport is taken instead."""
    from playwright.sync_api import Error

    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    try:
        page.screenshot(path=str(path), full_page=True)
    except Error:
        page.wait_for_timeout(250)
        page.screenshot(path=str(path))
    return path


def usable_password(user, password: str) -> None:
    """Hash the password with the server's default hasher (the test process uses a fast one the server lacks)."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(password, hasher.salt())
    user.save(update_fields=["password"])


def log_in(page, base_url: str, username: str, password: str) -> None:
    page.goto(f"{base_url}/accounts/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(password)
    with page.expect_response(
        lambda response: response.url.endswith("/accounts/login/") and response.request.method == "POST"
    ) as answer:
        page.get_by_role("button", name="Log in").click()
    if answer.value.status == 429:  # say so, rather than time out waiting for the home page
        raise AssertionError(
            f"login refused by the rate limit (Retry-After {answer.value.headers.get('retry-after')})"
        )
    page.wait_for_url(f"{base_url}/")


# Records every violation the page reports, from before its first script runs (init scripts are not subject to
# the page's policy).
LISTEN = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile}:${e.lineNumber}) ${e.sample}`);
});
"""
SKIP = ("/accounts/logout/", "/static/", "/metrics", "/healthz", "/readyz", "/api/schema/")


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


def publish_in_a_thread(topic: str, kind: str, payload: dict) -> None:
    """Publish as a service would, from a thread without the browser's event loop (so the relay sends it)."""
    import threading

    from django.db import connection, transaction

    from controlplane import events

    def work():
        with transaction.atomic():
            events.publish([topic], kind, payload)
        connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
