"""Overlays: per-label and per-cluster values over a version's add-on values (label overlays, then cluster overlays,
each in list order), seen by drift and apply, on the cluster page and in the rollout preview's diff."""

import pytest

from controlplane.errors import ServiceError
from fleet.models import DriftFinding, SimulatedAddon
from fleet.overlays import merge_values
from fleet.services.blueprints import version_create
from fleet.services.clusters import cluster_reconcile
from fleet.services.drift import drift_sweep
from fleet.services.overlays import overlays_set
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on

pytestmark = pytest.mark.django_db


def _values(cluster, addon="gpu-operator"):
    return SimulatedAddon.objects.get(cluster=cluster, name=addon).values


@pytest.fixture
def fleet_of_two(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    gpu, other = clusters_on(v1, 2)
    gpu.labels = {"gpu": "h200"}
    gpu.save()
    return actor, bp, v1, gpu, other


def test_precedence_labels_then_cluster_each_in_order():
    assert merge_values({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": 9}, "l": [2]}) == {
        "a": {"b": 9, "c": 2},
        "l": [2],
    }


def test_an_overlay_changes_one_clusters_effective_values_and_drift_sees_it(fleet_of_two):
    actor, bp, v1, gpu, other = fleet_of_two
    overlays_set(
        actor=actor,
        blueprint=bp,
        overlays=[
            {"name": "h200", "labels": {"gpu": "h200"}, "addon": "gpu-operator", "values": {"mig": {"a": 1}}},
            {
                "name": "own",
                "cluster": gpu.name,
                "addon": "gpu-operator",
                "values": {"mig": {"a": 2, "b": 3}},
            },
        ],
    )
    drift_sweep()
    finding = DriftFinding.objects.get(cluster=gpu, resolved_at__isnull=True)
    assert finding.addon == "gpu-operator" and {c["path"] for c in finding.diff} == {"values.mig"}
    assert not DriftFinding.objects.filter(cluster=other, resolved_at__isnull=True).exists()
    cluster_reconcile(actor=actor, cluster=gpu)
    assert _values(gpu) == {"driver": {"enabled": True}, "mig": {"a": 2, "b": 3}}
    assert _values(other) == {"driver": {"enabled": True}}
    drift_sweep()
    assert not DriftFinding.objects.filter(resolved_at__isnull=True).exists()


def test_the_cluster_page_and_the_rollout_preview_show_effective_values(fleet_of_two, client, users):
    actor, bp, v1, gpu, other = fleet_of_two
    overlays_set(
        actor=actor,
        blueprint=bp,
        overlays=[{"name": "own", "cluster": gpu.pk, "addon": "gpu-operator", "values": {"replicas": 7}}],
    )
    client.force_login(users["operator"])
    page = client.get(f"/clusters/{gpu.pk}/").content.decode()
    assert "overlays: own" in page and "&quot;replicas&quot;: 7" in page
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    preview = client.post(
        "/rollouts/new/",
        {
            "version": f"{bp.pk}:{v2.number}",
            "target_kind": "clusters",
            "clusters": [gpu.pk, other.pk],
            "batch_size": "1",
            "canary": "0",
            "batch_percent": "25",
            "max_failures": "0",
            "soak_seconds": "0",
            "progress_deadline_seconds": "600",
            "auto_rollback": "on",
        },
    ).content.decode()
    assert preview.count("effective change") == 2
    assert "values.replicas" not in preview  # unchanged by the new version: the overlay stays on both sides
    assert "24.9.0" in preview and "24.9.1" in preview


@pytest.mark.parametrize(
    "overlays, field",
    [
        ("nope", "overlays"),
        ([{"name": "x", "addon": "gpu-operator", "values": {}}], "overlays[0].cluster"),
        (
            [{"name": "x", "cluster": 1, "labels": {"a": "b"}, "addon": "g", "values": {}}],
            "overlays[0].cluster",
        ),
        ([{"name": "x", "cluster": "no-such-cluster", "addon": "g", "values": {}}], "overlays[0].cluster"),
        ([{"name": "x", "cluster": 99999999999999, "addon": "g", "values": {}}], "overlays[0].cluster"),
        ([{"name": "x", "labels": {"a": 1}, "addon": "g", "values": {}}], "overlays[0].labels"),
        ([{"name": "x", "labels": {"a": "b"}, "addon": "g", "values": []}], "overlays[0].values"),
        ([{"name": "X", "labels": {"a": "b"}, "addon": "g", "values": {}}], "overlays[0].name"),
        ([{"name": "x", "labels": {"a": "b"}, "addon": "g", "values": {}, "extra": 1}], "overlays[0]"),
    ],
)
def test_bad_overlays_are_refused_naming_the_field(users, overlays, field):
    bp, _ = blueprint(users["operator"])
    with pytest.raises(ServiceError) as refused:
        overlays_set(actor=users["operator"], blueprint=bp, overlays=overlays)
    assert refused.value.field == field


def test_the_api_sets_and_reads_overlays(api, users, fleet_of_two):
    actor, bp, v1, gpu, other = fleet_of_two
    api.as_token(users["operator"])
    body = {
        "overlays": [{"name": "h200", "labels": {"gpu": "h200"}, "addon": "gpu-operator", "values": {"a": 1}}]
    }
    answer = api.put(f"/api/v1/blueprints/{bp.pk}/overlays/", body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["overlays"][0]["labels"] == {"gpu": "h200"}
    assert api.put(f"/api/v1/blueprints/{bp.pk}/overlays/", {"x": 1}, format="json").status_code == 400
    assert api.get(f"/api/v1/blueprints/{bp.pk}/overlays/").json()["overlays"][0]["name"] == "h200"
