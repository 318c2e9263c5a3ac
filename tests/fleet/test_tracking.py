"""Track-latest goes through the gates: letting a cluster track a blueprint whose latest version it does not carry
starts a rollout of that version to it (waves, soak, gate), and the confirmation says so; nothing moves at once."""

import pytest

from controlplane.errors import ServiceError
from fleet.choices import RolloutState
from fleet.models import Rollout, SimulatedAddon
from fleet.services.blueprints import blueprint_update, version_create
from fleet.services.clusters import cluster_assign
from fleet.services.rollout_steps import rollout_step
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on

pytestmark = pytest.mark.django_db


def _pinned_behind(users, **strategy):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False, strategy={"soak_seconds": 0, **strategy})
    cluster = clusters_on(v1, 1, track_latest=False)[0]
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    return actor, bp, cluster, v1, v2


def test_tracking_starts_a_rollout_and_the_cluster_moves_only_through_it(users):
    actor, bp, cluster, v1, v2 = _pinned_behind(users)
    cluster_assign(actor=actor, cluster=cluster, blueprint=bp, track_latest=True)
    cluster.refresh_from_db()
    assert cluster.blueprint_version == v1 and cluster.track_latest and cluster.pinned_reason == ""
    rollout = Rollout.objects.get(version=v2)
    assert list(rollout.clusters.values_list("cluster_id", flat=True)) == [cluster.pk]
    assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "24.9.0"
    for _ in range(20):
        rollout_step(rollout_id=rollout.pk)
        rollout.refresh_from_db()
        if rollout.state != RolloutState.RUNNING and rollout.state != RolloutState.PENDING:
            break
    assert rollout.state == RolloutState.SUCCEEDED
    cluster.refresh_from_db()
    assert cluster.blueprint_version == v2 and cluster.track_latest
    assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "24.9.1"


def test_tracking_what_it_carries_starts_nothing(users):
    actor, bp, cluster, v1, v2 = _pinned_behind(users)
    cluster_assign(actor=actor, cluster=cluster, blueprint=bp, version=2)
    cluster_assign(actor=actor, cluster=cluster, blueprint=bp, track_latest=True)
    cluster.refresh_from_db()
    assert cluster.blueprint_version == v2 and cluster.track_latest
    assert not Rollout.objects.filter(version=v2).exists()


def test_canaries_named_elsewhere_are_dropped_and_a_busy_cluster_is_refused(users):
    actor, bp, cluster, v1, v2 = _pinned_behind(users, canary=["some-other-cluster"])
    cluster_assign(actor=actor, cluster=cluster, blueprint=bp, track_latest=True)
    rollout = Rollout.objects.get(version=v2)
    assert rollout.canary == []
    with pytest.raises(ServiceError) as refused:
        cluster_assign(actor=actor, cluster=cluster, blueprint=bp, track_latest=True)
    assert refused.value.status == 409


def test_the_api_answers_with_the_version_still_carried(api, users):
    actor, bp, cluster, v1, v2 = _pinned_behind(users)
    api.as_token(users["operator"])
    answer = api.put(
        f"/api/v1/clusters/{cluster.pk}/blueprint/", {"blueprint": bp.pk, "track_latest": True}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert answer.json()["track_latest"] is True
    assert Rollout.objects.filter(version=v2, clusters__cluster=cluster).exists()


def test_the_confirmation_says_what_rolls_out_and_how(client, users):
    actor, bp, cluster, v1, v2 = _pinned_behind(users, progress_deadline_seconds=300)
    blueprint_update(actor=actor, blueprint=bp, default_strategy={"soak_seconds": 120, "auto_rollback": True})
    client.force_login(users["operator"])
    page = client.post(f"/clusters/{cluster.pk}/blueprint/", {"assignment": f"track:{bp.pk}"})
    text = page.content.decode()
    assert page.status_code == 200
    assert f"a rollout of {v2} to this cluster starts" in text
    assert "soaks 120 s" in text and "rolled back to the version it carries now" in text
    assert not Rollout.objects.filter(version=v2).exists()
    client.post(f"/clusters/{cluster.pk}/blueprint/", {"assignment": f"track:{bp.pk}", "confirmed": "yes"})
    assert Rollout.objects.filter(version=v2, clusters__cluster=cluster).exists()
