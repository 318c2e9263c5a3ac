"""The fleet API speaks in the numbers people use: a rollout names its version by number, counts are never null."""

import pytest

from fleet.services.blueprints import version_create
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(users):
    bp, v1 = blueprint(users["operator"], auto_rollout=False)
    fleet = make_fleet("eu-west")
    clusters_on(v1, 2, fleet=fleet)
    # Another blueprint's versions first, so a version's row id and its number differ.
    other, _ = blueprint(users["operator"], name="other", auto_rollout=False)
    for _ in range(2):
        version_create(actor=users["operator"], blueprint=other, addons=ADDONS)
    return {"blueprint": bp, "v1": v1}


def test_a_rollout_names_its_version_by_number_as_it_was_started(api, users, world):
    api.as_token(users["operator"])
    bp = world["blueprint"]
    api.post(
        f"/api/v1/blueprints/{bp.pk}/versions/",
        {"addons": bump(ADDONS, "gpu-operator", "24.9.1"), "activate": True},
        format="json",
    )
    version = bp.versions.get(number=2)
    assert version.pk != 2  # the test tells a row id from a number
    started = api.post(
        "/api/v1/rollouts/",
        {
            "blueprint": bp.pk,
            "version": 2,
            "targets": {"fleet": "eu-west"},
            "strategy": {"batch_size": 1, "soak_seconds": 0},
        },
        format="json",
    )
    assert started.status_code == 201, started.content
    assert started.json()["version"] == 2 and "version_number" not in started.json()
    listed = api.get("/api/v1/rollouts/").json()["results"][0]
    assert listed["version"] == 2 and listed["blueprint"] == bp.name
    assert api.get(f"/api/v1/rollouts/{started.json()['id']}/").json()["version"] == 2


def test_a_versions_cluster_count_is_a_number_in_every_answer(api, users, world):
    api.as_token(users["operator"])
    bp = world["blueprint"]
    created = api.post(f"/api/v1/blueprints/{bp.pk}/versions/", {"addons": ADDONS}, format="json")
    assert created.status_code == 201 and created.json()["clusters"] == 0, created.content
    number = created.json()["number"]
    assert api.get(f"/api/v1/blueprints/{bp.pk}/versions/{number}/").json()["clusters"] == 0
    assert (
        api.patch(f"/api/v1/blueprints/{bp.pk}/versions/{number}/", {"notes": "n"}, format="json").json()[
            "clusters"
        ]
        == 0
    )
    assert api.post(f"/api/v1/blueprints/{bp.pk}/versions/{number}/activate/").json()["clusters"] == 0
    assert api.get(f"/api/v1/blueprints/{bp.pk}/versions/1/").json()["clusters"] == 2
    counts = {
        row["number"]: row["clusters"] for row in api.get(f"/api/v1/blueprints/{bp.pk}/versions/").json()
    }
    assert counts == {1: 2, number: 0}
