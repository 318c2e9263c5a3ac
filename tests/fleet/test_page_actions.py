"""The fleet pages' write actions without a browser: bad input is a 4xx on the form (never a 500) and changes
nothing; a rollout starts only as previewed; a drift sweep reports the service's counts. (The browser walk of
every action, its confirmation and the refused roles is tests/browser/test_write_actions.py.)"""

import pytest

from fleet.models import BlueprintVersion, Rollout
from fleet.views_actions import sweep_message
from tests.support.blueprints import blueprint, clusters_on
from tests.support.factories import make_fleet, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(users):
    bp, v1 = blueprint(users["operator"], auto_rollout=False)
    fleet = make_fleet("page-actions")
    clusters = clusters_on(v1, 3, fleet=fleet)
    node = make_node(clusters[0])
    return {"bp": bp, "v1": v1, "clusters": clusters, "node": node}


@pytest.fixture
def operator(client, users):
    client.force_login(users["operator"])
    return client


@pytest.mark.parametrize(
    "content, error",
    [
        ("addons: [", "not valid YAML"),
        ("- just a list", "a mapping"),
        ("addons: 5", "addons"),
        ("addons: []\nsurprise: 1", "unknown keys: surprise"),
        ("a: &a [*a, *a, *a]", ""),
        ("[" * 5000, ""),
    ],
)
def test_a_bad_version_document_is_a_400_on_the_form(operator, world, content, error):
    for button in ("preview", "create"):
        response = operator.post(
            f"/blueprints/{world['bp'].pk}/versions/new/", {"content": content, button: "1"}
        )
        assert response.status_code == 400, content
        assert error in response.content.decode()
    assert BlueprintVersion.objects.filter(blueprint=world["bp"]).count() == 1


def test_a_version_refused_by_the_service_is_a_4xx_on_the_form(operator, world):
    # A parent that does not exist is not among the choices; an add-on without a chart is the service's refusal.
    response = operator.post(
        f"/blueprints/{world['bp'].pk}/versions/new/",
        {"content": "addons: []", "parent": "99", "create": "1"},
    )
    assert response.status_code == 400
    response = operator.post(
        f"/blueprints/{world['bp'].pk}/versions/new/", {"content": "addons:\n- name: x\n", "create": "1"}
    )
    assert response.status_code == 400
    assert BlueprintVersion.objects.filter(blueprint=world["bp"]).count() == 1


def test_huge_and_unknown_ids_are_404s(operator, world):
    huge = "9" * 30
    for path in (
        f"/blueprints/{huge}/versions/new/",
        f"/blueprints/{world['bp'].pk}/versions/{huge}/activate/",
        f"/clusters/{huge}/blueprint/",
        f"/nodes/{huge}/cordon/",
        f"/nodes/{world['node'].pk}/reboot/",
        f"/jobs/{huge}/cancel/",
    ):
        assert operator.post(path, {"confirmed": "yes"}).status_code == 404, path


def test_rollout_form_refuses_bad_input_inline(operator, world):
    bp, clusters = world["bp"], world["clusters"]
    base = {
        "version": f"{bp.pk}:1",
        "target_kind": "clusters",
        "clusters": [c.pk for c in clusters],
        "canary": "0",
        "batch_percent": "25",
        "max_failures": "0",
        "soak_seconds": "60",
        "progress_deadline_seconds": "600",
        "preview": "1",
    }
    for change in (
        {"version": "nope"},
        {"version": f"{bp.pk}:7"},
        {"clusters": ["x"]},
        {"clusters": ["999999"]},
        {"canary": "-1"},
        {"batch_percent": "0"},
        {"target_kind": "labels", "labels": "no-equals"},
        {"target_kind": "fleet"},
        {"target_kind": "everything"},
        {"canary": "99", "clusters": []},
    ):
        response = operator.post("/rollouts/new/", {**base, **change})
        assert response.status_code == 400, change
    assert not Rollout.objects.exists()


def test_a_rollout_starts_only_as_previewed(operator, world):
    bp, clusters = world["bp"], world["clusters"]
    form = {
        "version": f"{bp.pk}:1",
        "target_kind": "clusters",
        "clusters": [c.pk for c in clusters],
        "canary": "1",
        "batch_percent": "25",
        "batch_size": "1",
        "max_failures": "0",
        "soak_seconds": "60",
        "progress_deadline_seconds": "600",
        "auto_rollback": "on",
    }
    preview = operator.post("/rollouts/new/", {**form, "preview": "1"})
    assert preview.status_code == 200 and not Rollout.objects.exists()
    plan = preview.context["form"]["plan"].value()
    assert plan == ";".join(str(c.pk) for c in sorted(clusters, key=lambda c: c.name))
    # The form changed after the preview (two per batch now): shown again with the new plan, nothing started.
    moved = operator.post("/rollouts/new/", {**form, "batch_size": "2", "plan": plan, "start": "1"})
    assert moved.status_code == 409 and not Rollout.objects.exists()
    assert "The plan changed since the preview" in moved.content.decode()
    started = operator.post("/rollouts/new/", {**form, "plan": plan, "start": "1"})
    rollout = Rollout.objects.get()
    assert started.status_code == 302 and started.url == f"/rollouts/{rollout.pk}/"
    assert rollout.clusters.count() == 3 and rollout.batches.count() == 3


def test_the_import_page_refuses_a_bad_document_inline(operator, world):
    for document in ("apiVersion: lockstep.io/v1\nkind: Blueprint\n", "name: [", "x" * (600 * 1024)):
        response = operator.post("/blueprints/import/", {"document": document, "apply": "1"})
        assert response.status_code == 400
    assert BlueprintVersion.objects.count() == 1


def test_the_sweep_message_says_what_the_sweep_did():
    counts = {
        "clusters": 4,
        "checks": 20,
        "unreachable": 1,
        "opened": 2,
        "resolved": 1,
        "corrected": 1,
        "gave_up": 0,
        "would_correct": 0,
        "held": 3,
        "skipped": False,
    }
    assert sweep_message(counts) == (
        "Drift sweep: 4 clusters observed (20 add-on checks), 2 findings opened, "
        "1 resolved, 1 corrected, 3 held (automation paused), 1 cluster unreachable."
    )
