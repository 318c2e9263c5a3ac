"""The rollout preview's blast radius in a real browser (issue 53, item 3): an operator previews a rollout that
turns the protection runtime off, sees each cluster's running jobs with whether they stay protected and the
warning; Start without the acknowledgement is refused (400, the box named, nothing started), with it the rollout
starts. axe finds nothing serious on the preview."""

import pytest

from controlplane.access import Role
from fleet.models import Rollout
from tests.support.axe import axe_serious
from tests.support.blast import blast_world
from tests.support.browser import SERVER_ENV, log_in, screenshot, usable_password
from tests.support.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db
PASSWORD = "correct-horse-9"


@pytest.fixture(scope="module")
def served(tmp_path_factory, django_db_setup, django_db_blocker):
    """The blast world, committed, and a live server of its own; flushed at the end as a transactional test is."""
    from django.core.management import call_command

    from tests.support.processes import uvicorn_server

    with django_db_blocker.unblock():
        operator = make_user(Role.OPERATOR, username="blast-ops")
        usable_password(operator, PASSWORD)
        built = blast_world(operator, make_tenant("Acme"), make_tenant("Globex"))
    try:
        with uvicorn_server(tmp_path_factory.mktemp("blast-radius"), **SERVER_ENV) as running:
            yield running, {**built, "operator": operator.username}
    finally:
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0, allow_cascade=True)


def navigated(page, selector: str):
    with page.expect_navigation() as navigation:
        page.locator(selector).click()
    return navigation.value


def test_a_protection_dropping_rollout_warns_and_needs_the_acknowledgement(page, served):
    server, world = served
    v1, clusters, jobs = world["v1"], world["clusters"], world["jobs"]
    log_in(page, server.url, world["operator"], PASSWORD)
    page.goto(f"{server.url}/rollouts/new/")
    page.locator("#id_version").select_option(f"{v1.blueprint_id}:{v1.number}")
    page.get_by_label("named clusters").check()
    page.locator("#id_clusters").select_option([str(c.pk) for c in clusters])
    page.locator("#id_canary").fill("1")
    assert page.locator("#id_acknowledge_drop").count() == 0  # nothing to acknowledge before a preview
    assert navigated(page, "#rollout-preview").status == 200

    warning = page.locator("#rollout-blast-warning")
    assert "turns off runtime" in warning.inner_text()
    assert "Protection is dropped for 1 running job" in warning.inner_text()
    first = page.locator(f'.blast-jobs[data-cluster="{clusters[0].pk}"]')
    guarded = first.locator(f'tr[data-job="{jobs["guarded"].pk}"]')
    assert guarded.locator(".protected-now").inner_text() == "yes"
    assert guarded.locator(".protected-after").inner_text().startswith("no")
    bare = first.locator(f'tr[data-job="{jobs["bare"].pk}"]')
    assert [bare.locator(c).inner_text() for c in (".protected-now", ".protected-after")] == ["no", "no"]
    second = page.locator(f'.blast-jobs[data-cluster="{clusters[1].pk}"]')
    assert second.locator(f'tr[data-job="{jobs["theirs"].pk}"]').count() == 1
    assert page.get_by_label("I understand protection is dropped for 1 job").count() == 1
    screenshot(page, "rollout-blast-radius")
    assert axe_serious(page) == []

    refused = navigated(page, "#rollout-start")
    assert refused.status == 400
    assert "to start it" in page.locator("#field-acknowledge_drop").inner_text()
    assert not Rollout.objects.exists()

    page.get_by_label("I understand protection is dropped for 1 job").check()
    navigated(page, "#rollout-start")
    rollout = Rollout.objects.get()
    page.wait_for_url(f"{server.url}/rollouts/{rollout.pk}/")
    assert rollout.version_id == v1.pk and rollout.clusters.count() == 2
