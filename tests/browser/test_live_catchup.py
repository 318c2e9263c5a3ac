"""static/js/live.js against a live server in a real browser, where live delivery fails: an event whose relay
reached no socket shows on the open page once the server's heads reveal it, and a catch-up that fails (503 while
the database restarts) is retried until the gap is filled, so the page ends up with every event in order."""

import threading
import time
from contextlib import ExitStack
from unittest import mock

import pytest
from django.utils import timezone

from controlplane import events
from controlplane.models import Event
from tests.support.browser import log_in, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
HEADS_SECONDS, GRACE_SECONDS = 2.0, 1.0  # the server's heads period, shorter than in production (5 s)


@pytest.fixture
def server(tmp_path):
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    with uvicorn_server(
        tmp_path,
        **SERVER_ENV,
        LOCKSTEP_WS_HEADS_SECONDS=HEADS_SECONDS,
        LOCKSTEP_WS_HEADS_GRACE_SECONDS=GRACE_SECONDS,
    ) as running:
        yield running


def _relayed_to_no_socket(messages):
    """The relay in the second after Redis returns: Redis takes the messages, but the web process has not yet
    resubscribed its groups, so no socket gets them; the rows are marked sent and the sweep leaves them."""
    Event.objects.filter(pk__in=[pk for pk, _ in messages]).update(sent_at=timezone.now())
    return len(messages)


def store(topic: str, summary: str, *, relayed: bool) -> int:
    """Publish as a service does, from a thread without the browser's event loop (so the real relay sends it),
    or with the relay lost; returns the event's sequence number."""
    from django.db import connection, transaction

    done = {}

    def work():
        try:
            with ExitStack() as stack:
                if not relayed:
                    stack.enter_context(mock.patch.object(events, "relay", _relayed_to_no_socket))
                with transaction.atomic():
                    [event] = events.publish([topic], "test.note", {"summary": summary})
            done["seq"] = event.seq
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert Event.objects.get(topic=topic, seq=done["seq"]).sent_at is not None
    return done["seq"]


def open_live_home(page, server, user):
    """The provider home page, live on the fleet topic, with a recorder of every event applied to it."""
    usable_password(user, PASSWORD)
    log_in(page, server.url, user.username, PASSWORD)
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    page.wait_for_function(
        "() => { const t = window.LockstepLive.current.topics.fleet; return t && !t.catchingUp; }",
        timeout=10_000,
    )
    page.evaluate(
        "() => { window.applied = []; "
        "window.LockstepLive.current.subscribe('fleet', 0, (e) => window.applied.push(e.seq)); }"
    )


def feed_seqs(page) -> list[int]:
    """The fleet feed's events, oldest first (the feed shows the newest on top)."""
    return [
        int(s)
        for s in page.locator("#event-feed li[data-seq]").evaluate_all(
            "(items) => items.map((li) => li.dataset.seq)"
        )
    ][::-1]


def test_event_whose_relay_reached_no_socket_shows_after_the_next_heads(page, server, users):
    open_live_home(page, server, users["provider-admin"])
    catch_ups = []
    page.on(
        "request",
        lambda r: catch_ups.append((time.monotonic(), r.url)) if "/api/v1/events/" in r.url else None,
    )
    before = store("fleet", "delivered live", relayed=True)
    page.locator("#event-feed li", has_text="delivered live").wait_for(timeout=5_000)
    assert not catch_ups, "an event that arrives in order needs no catch-up"

    lost = store("fleet", "relayed to no socket", relayed=False)
    stored = time.monotonic()
    page.locator("#event-feed li", has_text="relayed to no socket").wait_for(
        timeout=(HEADS_SECONDS + GRACE_SECONDS + 5) * 1000
    )
    shown = time.monotonic() - stored
    print(
        f"\nlost relay: shown {shown:.2f} s after commit (heads every {HEADS_SECONDS} s, grace {GRACE_SECONDS} s)"
    )
    assert shown < HEADS_SECONDS + GRACE_SECONDS + 2.0, shown
    assert [url for _, url in catch_ups] and f"after={before}" in catch_ups[-1][1]
    assert page.evaluate("() => window.applied") == [before, lost]
    assert feed_seqs(page)[-2:] == [before, lost]


def test_failed_catch_up_is_retried_and_every_event_applied_in_order(page, server, users):
    open_live_home(page, server, users["provider-admin"])
    calls = []

    def flaky(route):
        calls.append(time.monotonic())
        if len(calls) <= 2:  # the database restarting: the first two catch-ups fail
            route.fulfill(
                status=503, content_type="application/json", body='{"detail": "database restarting"}'
            )
        else:
            route.continue_()

    page.route("**/api/v1/events/**", flaky)
    first = store("fleet", "first, lost", relayed=False)
    second = store("fleet", "second, live", relayed=True)  # a gap: catch-up, which fails
    page.wait_for_function("() => window.LockstepLive.current.topics.fleet.queue.length === 1", timeout=5_000)
    while len(calls) < 1:
        page.wait_for_timeout(20)
    third = store("fleet", "third, while retrying", relayed=True)
    page.wait_for_function("() => window.LockstepLive.current.topics.fleet.queue.length === 2", timeout=5_000)
    assert page.evaluate("() => window.applied") == [], "nothing is applied past the gap"
    page.wait_for_function("() => window.applied.length === 3", timeout=10_000)
    assert page.evaluate("() => window.applied") == [first, second, third]
    assert feed_seqs(page)[-3:] == [first, second, third]
    gaps = [round(b - a, 2) for a, b in zip(calls, calls[1:], strict=False)]
    print(f"\ncatch-up tries {len(calls)}, waits between them {gaps} s")
    assert len(calls) == 3
    assert 0.9 <= gaps[0] < 1.6 and 1.9 <= gaps[1] < 2.6, gaps  # 1 s, then 2 s
    # The retry delay starts again from 1 s after a success.
    assert page.evaluate("() => window.LockstepLive.current.topics.fleet.retryDelay") == 1000
    # And live delivery carries on in order.
    fourth = store("fleet", "fourth, live", relayed=True)
    page.wait_for_function("() => window.applied.length === 4", timeout=5_000)
    assert page.evaluate("() => window.applied") == [first, second, third, fourth]
