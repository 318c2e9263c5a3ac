"""Drain from the node page in a real browser (issue 47, item 3): the operator confirms, a real Celery worker
raises and decides the drain request, beat moves the job and completes the drain, and the page shows it; where the
job cannot move, the page says what the drain waits for and since when. Screenshots go to test-artifacts/."""

import time

import pytest
from django.contrib.auth import get_user_model

from controlplane.access import Role
from fleet.choices import NodeState
from jobs.models import FaultEvent, RecoveryAction
from tests.support.browser import SERVER_ENV, log_in, screenshot, usable_password
from tests.support.factories import make_cluster, make_tenant, make_user
from tests.support.jobs import INSTANT, beat_in_a_thread, bulk_nodes, node_of, protected_cluster, submit

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
PASSWORD = "correct-horse-9"
ERRORS: list[str] = []  # what beat's steps raised


def beat(interval: float = 0.3):
    """Beat's recovery and drain steps in a thread of their own (their own connection: they commit)."""
    return beat_in_a_thread(interval=interval, drains=True, errors=ERRORS)


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """A protected cluster whose job can move to a spare, a cluster without spares whose unprotected job cannot,
    and an operator with a known password. Flushed at the end of the module."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        tenant = make_tenant("Drainco")
        movable = protected_cluster(nodes=2, spares=1, connection=INSTANT)
        stuck = make_cluster(connection=INSTANT)
        bulk_nodes(stuck, 1)
        moving_job = submit(movable, tenant, gpus=16)
        stuck_job = submit(stuck, tenant, gpus=8)
        make_user(Role.OPERATOR, username="drainer", password=PASSWORD)
        usable_password(get_user_model().objects.get(username="drainer"), PASSWORD)
        found = {
            "moving": (moving_job, node_of(moving_job)),
            "stuck": (stuck_job, node_of(stuck_job)),
        }
    yield found
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0, allow_cascade=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, django_db_setup):
    """One uvicorn, one Celery worker and beat's steps for the module."""
    from tests.support.processes import celery_worker, uvicorn_server

    where = tmp_path_factory.mktemp("drain")
    with uvicorn_server(where, **SERVER_ENV) as server, celery_worker(where) as worker, beat():
        yield server, worker


def drain_from_the_page(page, url: str, node) -> None:
    """Open the node's page, click Drain, confirm it; the node page again."""
    page.goto(f"{url}/nodes/{node.pk}/")
    page.locator("#node-reason-drain").fill("firmware update")
    with page.expect_navigation():
        page.locator('#node-actions button[data-action="drain"]').click()
    assert "moved off it" in page.locator("#confirm").inner_text()
    with page.expect_navigation():
        page.locator("#confirm button[type=submit]").click()
    assert page.locator("#node-state").inner_text() == NodeState.DRAINING


def reload_until(page, predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            screenshot(page, "drain-timeout")
            shown = page.locator("main").inner_text()[:1500]
            raise AssertionError(f"timed out waiting for {what} (beat raised {ERRORS[-3:]}): {shown}")
        page.wait_for_timeout(500)
        page.reload()


def test_drain_moves_a_protected_job_off_and_the_node_ends_cordoned(page, stack, world):
    server, worker = stack
    job, node = world["moving"]
    log_in(page, server.url, "drainer", PASSWORD)
    drain_from_the_page(page, server.url, node)
    reload_until(
        page,
        lambda: page.locator("#node-state").inner_text() == NodeState.CORDONED,
        "the job to move off and the drain to complete",
    )
    screenshot(page, "node-drained")
    [action] = RecoveryAction.objects.filter(job=job)
    assert action.kind == "live_migration" and action.state == "succeeded"
    # The page shows the move: the job in the past list, the drain request answered with a live migration.
    assert page.locator(f'#node-allocations tr.past[data-job="{job.pk}"]').count() == 1
    assert page.locator("#node-allocations tr.current .empty").count() == 1
    request = FaultEvent.objects.get(node=node, kind="drain")
    row = page.locator(f'#node-fault-table tr[data-fault="{request.pk}"]')
    assert "live_migration" in row.inner_text() and "succeeded" in row.inner_text()
    assert page.locator("#node-drain").count() == 0
    assert "Traceback" not in worker.log.read_text()


def test_a_job_that_cannot_move_is_what_the_drain_page_says_it_waits_for(page, stack, world):
    server, worker = stack
    job, node = world["stuck"]
    log_in(page, server.url, "drainer", PASSWORD)
    drain_from_the_page(page, server.url, node)
    waits = page.locator(f'#drain-waits tr[data-job="{job.pk}"]')
    reload_until(
        page,
        lambda: waits.count() == 1 and "waiting for a healthy spare" in waits.inner_text(),
        "the page to say the restart waits for a spare",
    )
    screenshot(page, "node-drain-waits")
    [action] = RecoveryAction.objects.filter(job=job)
    assert action.kind == "restart_from_checkpoint" and action.state == "planned"
    text = waits.inner_text()
    assert job.name in text and f"action {action.pk}" in text
    assert waits.locator("td").nth(2).inner_text().strip() != ""  # since when
    assert "Draining since" in page.locator("#node-drain").inner_text()
    assert page.locator("#node-state").inner_text() == NodeState.DRAINING
    assert "Traceback" not in worker.log.read_text()
