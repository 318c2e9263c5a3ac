"""One Kubernetes cluster whose API cannot be reached, or whose kubeconfig cannot be loaded, stays that cluster's
problem (issue 54: a ``ConfigException`` or ``MaxRetryError`` escaped the driver, the reconcile answered 500 and the
drift sweep stopped for every cluster).

Real: the kubeconfig files, the kubernetes client and its connection to an address where nothing listens. Faked:
only the helm binary (not installed where Lockstep is tested), which lists no releases, so the driver goes on to
the Kubernetes API as it would on a live cluster.
"""

import pytest
from django.utils import timezone

from fleet.choices import HealthStatus, SyncStatus
from fleet.drivers.kubernetes import CommandResult, KubernetesDriver
from fleet.drivers.simulated import simulate_drift
from fleet.models import Cluster, ObservedAddon
from fleet.services.drift import drift_sweep
from tests.support.blueprints import blueprint, clusters_on
from tests.support.factories import make_cluster, make_node
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""


@pytest.fixture
def no_helm_releases(monkeypatch):
    monkeypatch.setattr(
        KubernetesDriver, "runner", staticmethod(lambda args, stdin, timeout: CommandResult(0, "[]", ""))
    )


@pytest.fixture
def broken(users, tmp_path, no_helm_releases):
    """Two simulated clusters on a blueprint, one with drift; two Kubernetes clusters on it that cannot answer."""
    _, v1 = blueprint(users["operator"])
    good = clusters_on(v1, 2)
    simulate_drift(good[1], addon="gpu-operator", kind="version", version="25.0.0")
    kubeconfig = tmp_path / "refused.yaml"
    kubeconfig.write_text(KUBECONFIG.format(port=free_port()))
    on = {"fleet": good[0].fleet, "driver": "kubernetes", "blueprint": v1.blueprint, "blueprint_version": v1}
    no_config = make_cluster(**on, connection={"kubeconfig": str(tmp_path / "missing.yaml")})
    refused = make_cluster(**on, connection={"kubeconfig": str(kubeconfig), "timeout_seconds": 5})
    for cluster in (no_config, refused):
        ObservedAddon.objects.create(
            cluster=cluster, name="gpu-operator", sync="InSync", health="Healthy", observed_at=timezone.now()
        )
    return good, no_config, refused


def test_the_sweep_observes_every_other_cluster_and_marks_the_broken_ones_unknown_with_why(broken):
    good, no_config, refused = broken
    report = drift_sweep()
    assert report.clusters == 4 and report.unreachable == sorted([no_config.pk, refused.pk])
    assert report.opened == 1  # the good cluster's drift was found
    assert ObservedAddon.objects.filter(cluster__in=good).count() == 6
    for cluster in (no_config, refused):
        row = ObservedAddon.objects.get(cluster=cluster)
        assert (row.sync, row.health) == (SyncStatus.UNKNOWN, HealthStatus.UNKNOWN)
    errors = dict(Cluster.objects.values_list("pk", "observation_error"))
    assert errors[good[0].pk] == errors[good[1].pk] == ""
    assert errors[no_config.pk] == "the cluster's Kubernetes configuration cannot be loaded (ConfigException)"
    assert errors[refused.pk].startswith("list nodes: the Kubernetes API server cannot be reached (")
    assert "Connection refused" in errors[refused.pk]
    assert "missing.yaml" not in errors[no_config.pk]  # no path of the provider's host in what users read


def test_reconcile_of_a_broken_cluster_answers_503_with_the_reason_and_a_good_one_200(broken, api, users):
    good, no_config, refused = broken
    api.as_token(users["operator"], "write")
    for cluster, reason in ((no_config, "configuration cannot be loaded"), (refused, "cannot be reached")):
        response = api.post(f"/api/v1/clusters/{cluster.pk}/reconcile/")
        assert response.status_code == 503, response.content
        assert reason in response.json()["detail"]
    response = api.post(f"/api/v1/clusters/{good[1].pk}/reconcile/")
    assert response.status_code == 200 and response.json()["corrected"] == ["gpu-operator"]
    drift_sweep()
    detail = api.get(f"/api/v1/clusters/{refused.pk}/").json()
    assert "cannot be reached" in detail["observation_error"] and detail["last_observed_at"] is None


def test_node_operations_on_an_unreachable_cluster_answer_503_and_change_nothing(broken, api, users):
    _, _, refused = broken
    node = make_node(refused, "gpu-1")
    api.as_token(users["operator"], "write")
    for operation in ("cordon", "drain"):
        response = api.post(f"/api/v1/nodes/{node.pk}/{operation}/", {"reason": "maintenance"}, format="json")
        assert response.status_code == 503, response.content
        assert "cannot be reached" in response.json()["detail"]
    node.refresh_from_db()
    assert node.state == "ready"


def test_a_driver_error_the_driver_did_not_translate_is_still_that_clusters_alone(users, monkeypatch):
    """A bug in a driver (any exception, not a DriverError) makes its cluster Unknown, not the sweep fail."""
    _, v1 = blueprint(users["operator"])
    good, bad = clusters_on(v1, 2)
    bad.connection = {"kubeconfig": "/x"}
    bad.driver = "kubernetes"
    bad.save()

    def broken_factory(connection):
        raise RuntimeError("a bug")

    monkeypatch.setattr(KubernetesDriver, "core_api_factory", staticmethod(broken_factory))
    monkeypatch.setattr(
        KubernetesDriver, "runner", staticmethod(lambda args, stdin, timeout: CommandResult(0, "[]", ""))
    )
    report = drift_sweep()
    assert report.unreachable == [bad.pk] and report.checks == 3
    bad.refresh_from_db()
    assert bad.observation_error == "the kubernetes driver failed: RuntimeError"
