"""Stuck Helm releases: a release left pending by a crashed upgrade is Degraded past the deadline with Helm's own
description, the next apply rolls it back (or uninstalls an unfinished first install) and upgrades again, and the
message reaches the cluster's status and the fleet roll-up. Against the recording helm fake, with Helm's command
lines and messages (no live API server or helm binary exists here)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.choices import HealthStatus
from fleet.drivers import DriverError
from fleet.drivers.kubernetes import KubernetesDriver, helm_time
from fleet.services.observation import observe, record
from fleet.status import cluster_status, rollup
from tests.support.factories import make_cluster
from tests.support.kubernetes import FakeCore, FakeHelmReleases

pytestmark = pytest.mark.django_db

SPEC = {
    "name": "gpu-operator",
    "repo": "https://helm.ngc.nvidia.com/nvidia",
    "chart": "gpu-operator",
    "version": "v24.9.1",
    "namespace": "gpu-operator",
    "values": {},
}


def _ago(**delta) -> str:
    return (timezone.now() - timedelta(**delta)).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")


@pytest.fixture
def cluster():
    return make_cluster(driver="kubernetes", connection={"kubeconfig": "/etc/lockstep/c1.yaml"})


def _stuck(helm, minutes=60, first_install=False):
    good = [("superseded", "gpu-operator-v24.9.0", _ago(days=2), "Install complete")]
    pending = [("pending-upgrade", "gpu-operator-v24.9.1", _ago(minutes=minutes), "Preparing upgrade")]
    if first_install:
        good, pending = (
            [],
            [("pending-install", "gpu-operator-v24.9.1", _ago(minutes=minutes), "Initial install underway")],
        )
    helm.release("gpu-operator", "gpu-operator", good + pending)


def test_helm_times_in_both_formats():
    assert helm_time("2024-05-01 10:00:00.123456789 +0200 CEST").isoformat() == "2024-05-01T08:00:00+00:00"
    assert helm_time("2024-05-01T10:00:00.5Z").isoformat() == "2024-05-01T10:00:00+00:00"
    assert helm_time("yesterday") is None


def test_a_release_pending_past_the_deadline_is_degraded_with_helms_description(cluster):
    helm = FakeHelmReleases()
    _stuck(helm)
    helm.release(
        "network-operator",
        "network-operator",
        [("pending-upgrade", "network-operator-24.7.0", _ago(seconds=5), "Preparing upgrade")],
    )
    observed = {
        o.name: o for o in KubernetesDriver(cluster, runner=helm, core_api=FakeCore()).observe_addons()
    }
    stuck = observed["gpu-operator"]
    assert stuck.health == HealthStatus.DEGRADED
    assert (
        "pending-upgrade since" in stuck.message
        and "past the pending deadline: Preparing upgrade" in stuck.message
    )
    assert (
        observed["network-operator"].health == HealthStatus.PROGRESSING
        and observed["network-operator"].message == ""
    )
    cluster.connection = {**cluster.connection, "pending_deadline_seconds": 7200}
    observed = {
        o.name: o for o in KubernetesDriver(cluster, runner=helm, core_api=FakeCore()).observe_addons()
    }
    assert observed["gpu-operator"].health == HealthStatus.PROGRESSING


def test_apply_rolls_back_the_pending_revision_then_upgrades(cluster):
    helm = FakeHelmReleases()
    _stuck(helm)
    result = KubernetesDriver(cluster, runner=helm).apply_addon(SPEC)
    verbs = [args[1:4] for args, _ in helm.commands]
    assert verbs == [
        ["upgrade", "--install", "gpu-operator"],
        ["history", "gpu-operator", "--namespace"],
        ["rollback", "gpu-operator", "1"],
        ["upgrade", "--install", "gpu-operator"],
    ]
    rollback = helm.commands[2][0]
    assert rollback[:6] == ["helm", "rollback", "gpu-operator", "1", "--namespace", "gpu-operator"]
    assert "--kubeconfig" in rollback
    assert "rolled back pending-upgrade revision 2 to revision 1" in result.detail
    history = helm.releases[("gpu-operator", "gpu-operator")]
    assert history[-1]["status"] == "deployed" and history[-1]["chart"] == "gpu-operator-v24.9.1"


def test_an_unfinished_first_install_is_uninstalled_then_installed(cluster):
    helm = FakeHelmReleases()
    _stuck(helm, first_install=True)
    KubernetesDriver(cluster, runner=helm).apply_addon(SPEC)
    assert [args[1] for args, _ in helm.commands] == ["upgrade", "history", "uninstall", "upgrade"]
    assert helm.releases[("gpu-operator", "gpu-operator")][-1]["status"] == "deployed"


def test_a_release_pending_within_the_deadline_waits_with_helms_message(cluster):
    helm = FakeHelmReleases()
    _stuck(helm, minutes=1)
    with pytest.raises(DriverError) as waiting:
        KubernetesDriver(cluster, runner=helm).apply_addon(SPEC)
    assert waiting.value.transient
    assert "another operation (install/upgrade/rollback) is in progress" in str(waiting.value)
    assert [args[1] for args, _ in helm.commands] == ["upgrade", "history"]


def test_the_message_reaches_the_clusters_status_and_the_fleet_rollup(cluster, monkeypatch, api, users):
    helm = FakeHelmReleases()
    _stuck(helm)
    monkeypatch.setattr(KubernetesDriver, "runner", staticmethod(helm))
    monkeypatch.setattr(KubernetesDriver, "core_api_factory", staticmethod(lambda connection: FakeCore()))
    from fleet.desired import compare

    observed, errors = observe([cluster])
    assert not errors
    record({cluster.pk: compare({}, observed[cluster.pk])}, {}, timezone.now())
    status = cluster_status([cluster.pk])[cluster.pk]
    assert status.health == HealthStatus.DEGRADED
    assert status.messages[0].startswith(f"{cluster.name}/gpu-operator: pending-upgrade since")
    assert rollup([status]).messages == status.messages
    api.as_token(users["operator"])
    shown = api.get(f"/api/v1/clusters/{cluster.pk}/").json()["status"]
    assert "Preparing upgrade" in shown["messages"][0]
