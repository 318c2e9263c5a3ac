import os

import pytest

from controlplane.testing.browser import CHROMIUM, browser


@pytest.fixture(scope="module")
def chromium():
    """One browser per test module. Playwright's sync API keeps an event loop running in this thread while the
    browser is open, so Django's async-safety check must stand aside (the ORM calls here are plain sync code);
    the module scope closes the browser before tests of other modules start their own event loops."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium); .ci/run does")
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with browser() as running:
            yield running
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(chromium):
    context = chromium.new_context(viewport={"width": 1440, "height": 900}, timezone_id="Europe/Berlin")
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def server(tmp_path):
    from controlplane.testing.processes import uvicorn_server

    with uvicorn_server(tmp_path) as running:
        yield running
