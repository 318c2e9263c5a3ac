"""Drift: detection through the driver, findings opened and resolved, correction that converges or gives up."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.models import Event
from fleet.choices import DriftKind, HealthStatus, SyncStatus
from fleet.drivers.simulated import simulate_drift
from fleet.models import DriftFinding, ObservedAddon
from fleet.services.drift import drift_sweep
from fleet.status import cluster_status, fleet_status
from tests.support.blueprints import blueprint, clusters_on

pytestmark = pytest.mark.django_db


def test_in_sync_clusters_have_no_findings_and_roll_up_ready(users):
    _, v1 = blueprint(users["operator"])
    clusters = clusters_on(v1, 2)
    report = drift_sweep()
    assert report.clusters == 2 and report.checks == 6 and report.opened == 0
    assert set(ObservedAddon.objects.values_list("sync", "health")) == {
        (SyncStatus.IN_SYNC, HealthStatus.HEALTHY)
    }
    status = cluster_status([c.pk for c in clusters])[clusters[0].pk]
    assert (status.sync, status.health, status.ready, status.total) == ("InSync", "Healthy", 3, 3)
    assert fleet_status(clusters[0].fleet_id).ready == 2


def test_each_kind_of_drift_is_found_with_its_diff_and_resolved_when_gone(users):
    _, v1 = blueprint(users["operator"])
    a, b, c, d = clusters_on(v1, 4)
    simulate_drift(a, addon="gpu-operator", kind="version", version="25.0.0")
    simulate_drift(b, addon="nic-failover", kind="values")
    simulate_drift(c, addon="network-operator", kind="remove")
    simulate_drift(d, kind="extra", addon="rogue-exporter")
    report = drift_sweep()
    assert report.opened == 4
    found = {f.cluster_id: f for f in DriftFinding.objects.filter(resolved_at__isnull=True)}
    assert found[a.pk].kind == DriftKind.VERSION_MISMATCH
    assert {"path": "version", "op": "changed", "desired": "24.9.0", "observed": "25.0.0"} in found[a.pk].diff
    assert found[b.pk].kind == DriftKind.VALUES_CHANGED
    assert found[b.pk].diff == [{"path": "values.driftedBy", "op": "added", "observed": "simulate"}]
    assert found[c.pk].kind == DriftKind.MISSING and found[d.pk].kind == DriftKind.UNEXPECTED
    worst = cluster_status([c.pk])[c.pk]
    assert worst.sync == SyncStatus.OUT_OF_SYNC and worst.health == HealthStatus.MISSING and worst.ready == 2
    assert Event.objects.filter(kind="drift.changed", topic=f"cluster-{a.pk}").exists()
    # a second sweep changes nothing
    again = drift_sweep()
    assert again.opened == 0 and again.resolved == 0
    # the drift goes away by itself (someone fixed it by hand)
    from fleet.models import SimulatedAddon

    SimulatedAddon.objects.filter(cluster=a, name="gpu-operator").update(version="24.9.0")
    report = drift_sweep()
    assert report.resolved == 1
    finding = DriftFinding.objects.get(cluster=a)
    assert finding.resolution == DriftFinding.Resolution.CONVERGED and finding.resolved_at


def test_correction_converges_by_the_next_sweep(users):
    _, v1 = blueprint(users["operator"], drift_mode="correct")
    (cluster,) = clusters_on(v1, 1)
    simulate_drift(cluster, addon="gpu-operator", kind="version", version="25.0.0")
    simulate_drift(cluster, kind="extra")
    first = drift_sweep()
    assert first.opened == 2 and first.corrected == 2
    second = drift_sweep()
    assert second.resolved == 2 and second.opened == 0
    assert set(DriftFinding.objects.values_list("resolution", flat=True)) == {"corrected"}
    assert set(ObservedAddon.objects.filter(cluster=cluster).values_list("sync", flat=True)) == {"InSync"}


def test_a_correction_that_keeps_failing_is_reported_not_retried_forever(users, settings):
    settings.DRIFT_MAX_CORRECTIONS = 2
    _, v1 = blueprint(users["operator"], drift_mode="correct")
    (cluster,) = clusters_on(v1, 1)
    simulate_drift(cluster, addon="gpu-operator", kind="version", version="25.0.0")
    cluster.connection = {"apply_fails": True}
    cluster.save()
    reports = [drift_sweep() for _ in range(5)]
    finding = DriftFinding.objects.get()
    assert finding.correction_attempts == 2 and finding.gave_up_at is not None
    assert "refused" in finding.last_correction_error
    assert [r.gave_up for r in reports] == [0, 0, 1, 0, 0]
    assert (
        Event.objects.filter(kind="drift.changed", payload__gave_up=["gpu-operator"]).count() == 2
    )  # fleet + cluster


def test_an_unreachable_cluster_is_unknown_and_does_not_blind_the_sweep(users):
    _, v1 = blueprint(users["operator"])
    good, bad = clusters_on(v1, 2)
    drift_sweep()
    bad.connection = {"unreachable": True}
    bad.save()
    simulate_drift(good, addon="gpu-operator", kind="version", version="25.0.0")
    report = drift_sweep()
    assert report.unreachable == [bad.pk] and report.opened == 1
    assert set(ObservedAddon.objects.filter(cluster=bad).values_list("sync", "health")) == {
        ("Unknown", "Unknown")
    }


def test_node_software_is_drift_checked_like_an_add_on(users):
    from fleet.models import SimulatedAddon

    _, v1 = blueprint(users["operator"], node_software={"cuda": "12.4"})
    (cluster,) = clusters_on(v1, 1)
    SimulatedAddon.objects.filter(cluster=cluster, name="node-software.cuda").update(version="12.2")
    drift_sweep()
    finding = DriftFinding.objects.get()
    assert finding.addon == "node-software.cuda" and finding.kind == DriftKind.VERSION_MISMATCH


def test_sweep_query_count_does_not_grow_with_clusters(users):
    _, v1 = blueprint(users["operator"])
    clusters_on(v1, 3)
    drift_sweep()
    with CaptureQueriesContext(connection) as few:
        drift_sweep()
    clusters_on(v1, 12)
    drift_sweep()
    with CaptureQueriesContext(connection) as many:
        drift_sweep()
    assert len(many) == len(few), [q["sql"][:80] for q in many]
