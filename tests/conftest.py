"""Fixtures for the whole suite. What they are built from (factories, processes, the browser) is in tests/support/."""

import os

import pytest
import redis
from channels.layers import channel_layers
from django.conf import settings
from rest_framework.test import APIClient

from controlplane.access import Role
from tests.support.factories import make_tenant, make_user, token_header
from tests.support.processes import PrivateRedis
from tests.support.slow import ProcessWatch, slow_items

PROCESS_WATCH = ProcessWatch()


def pytest_configure(config):
    PROCESS_WATCH.install()


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that starts a process (tests/support/slow.py), so ``-m "not slow"`` (make test-fast)
    runs only those that start none."""
    for item in slow_items(items):
        if item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    PROCESS_WATCH.begin(item.nodeid)
    try:
        return (yield)
    finally:
        PROCESS_WATCH.end()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    outer = PROCESS_WATCH.shared_fixture
    PROCESS_WATCH.shared_fixture = outer or fixturedef.scope != "function"
    try:
        return (yield)
    finally:
        PROCESS_WATCH.shared_fixture = outer


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    started = PROCESS_WATCH.started
    if started and item.get_closest_marker("slow") is None:
        raise AssertionError(
            f"{item.nodeid} started {len(started)} process(es) ({started[0][:200]}) but is not marked slow: add "
            "@pytest.mark.slow (make test-fast must start no process), or let tests/support/slow.py find it"
        )
    return result


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing():
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session", autouse=True)
def _clean_test_redis():
    """The suite owns its Redis database (REDIS_URL, DB 14 by default; under xdist each worker its own, see
    controlplane/testing/settings.py): start it empty. FLUSHDB empties that one database only."""
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


@pytest.fixture(scope="session", autouse=True)
def _terminate_stray_connections(django_db_setup, django_db_blocker):
    """Threads (websocket consumers, readyz checks) keep connections; end them so the test database can go."""
    yield
    with django_db_blocker.unblock():
        from django.db import DatabaseError, connection

        if connection.vendor == "postgresql" and connection.settings_dict["NAME"].startswith("test_"):
            try:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
            except DatabaseError:
                pass


@pytest.fixture(autouse=True)
def _no_tasks_left_by_earlier_tests():
    """Tasks an earlier test queued with no worker to run them must not run in a later test's worker: their rows
    are gone, or they act on the later test's rows (a drift sweep queued by the audit test re-observed the storm
    test's cluster while it ran, and its jobs were judged unprotected). Only what was queued before this test
    starts is dropped: its own tasks, and their redelivery to a restarted worker, are untouched."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    stale = [key for key in client.scan_iter("celery*") if client.type(key) == b"list"]
    client.delete(*stale, "unacked", "unacked_index", "unacked_mutex")


@pytest.fixture(autouse=True)
def _fresh_channel_layers():
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture
def keep_connection():
    """The WSGI handler closes database connections around each request; inside a test's transaction it
    must not (Django's own test client disconnects the same receivers)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def tenant_a(db):
    return make_tenant("Acme")


@pytest.fixture
def tenant_b(db):
    return make_tenant("Globex")


@pytest.fixture
def users(db, tenant_a, tenant_b):
    """One user per role, and a second tenant's admin and viewer for isolation checks."""
    return {
        "provider-admin": make_user(Role.PROVIDER_ADMIN),
        "operator": make_user(Role.OPERATOR),
        "tenant-admin": make_user(Role.TENANT_ADMIN, tenant_a),
        "tenant-viewer": make_user(Role.TENANT_VIEWER, tenant_a),
        "other-admin": make_user(Role.TENANT_ADMIN, tenant_b),
        "other-viewer": make_user(Role.TENANT_VIEWER, tenant_b),
    }


@pytest.fixture
def api():
    """An API client; call ``api.as_token(user, scope)`` to authenticate with a real bearer token."""

    class Client(APIClient):
        def as_token(self, user, scope="write"):
            self.credentials(**token_header(user, scope))
            return self

    return Client()


@pytest.fixture
def private_redis():
    server = PrivateRedis().start()
    yield server
    server.stop()


# --- browser tests: one Chromium per test module, a page per test, a live uvicorn -----------------------------


@pytest.fixture(scope="module")
def chromium():
    """One browser per test module. Playwright's sync API keeps an event loop running in this thread while the
    browser is open, so Django's async-safety check must stand aside (the ORM calls here are plain sync code);
    the module scope closes the browser before tests of other modules start their own event loops."""
    from tests.support.browser import CHROMIUM, browser

    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install chromium); .ci/run does"
        )
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
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(tmp_path, **SERVER_ENV) as running:
        yield running
