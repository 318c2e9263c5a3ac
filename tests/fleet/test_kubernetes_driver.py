"""The Kubernetes driver, against a recording fake of the CoreV1Api and a fake helm runner.

Mocked here, and only here: the Kubernetes API server and the helm binary (neither exists where Lockstep is
tested). What is checked is what the driver sends: the node PATCHes, the Eviction requests, the helm command lines.
"""

import json

import pytest

from fleet.choices import HealthStatus
from fleet.drivers import DriverError, driver_for
from fleet.drivers.base import Operation
from fleet.drivers.kubernetes import CommandResult, KubernetesDriver, split_chart
from tests.support.factories import make_cluster, make_node
from tests.support.kubernetes import FakeCore, pod

pytestmark = pytest.mark.django_db


class FakeHelm:
    def __init__(self, replies=None):
        self.commands, self.replies = [], replies or {}

    def __call__(self, args, stdin, timeout):
        self.commands.append((args, stdin))
        for prefix, reply in self.replies.items():
            if " ".join(args[1:]).startswith(prefix):
                return reply
        return CommandResult(0, "{}", "")


@pytest.fixture
def cluster():
    return make_cluster(
        driver="kubernetes", connection={"kubeconfig": "/etc/lockstep/c1.yaml", "context": "c1"}
    )


def test_driver_declares_what_it_supports(cluster):
    driver = driver_for(cluster)
    assert isinstance(driver, KubernetesDriver)
    assert Operation.DRAIN in driver.supports and Operation.APPLY_ADDON in driver.supports
    assert Operation.NIC_FAILOVER not in driver.supports
    with pytest.raises(DriverError):
        driver.fail_over_nic(None, "a", "b")


def test_cordon_and_uncordon_patch_spec_unschedulable(cluster):
    core = FakeCore()
    node = make_node(cluster, "gpu-1")
    driver = KubernetesDriver(cluster, core_api=core)
    driver.cordon(node)
    driver.uncordon(node)
    assert core.calls == [
        ("patch_node", "gpu-1", {"spec": {"unschedulable": True}}),
        ("patch_node", "gpu-1", {"spec": {"unschedulable": False}}),
    ]


def test_taint_keeps_existing_taints_and_replaces_the_same_key(cluster):
    core = FakeCore(
        taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "lockstep.io/quarantine", "value": "old", "effect": "NoSchedule"},
        ]
    )
    driver = KubernetesDriver(cluster, core_api=core)
    driver.taint(make_node(cluster, "gpu-1"), "lockstep.io/quarantine", "xid-79", "NoSchedule")
    assert core.calls[-1] == (
        "patch_node",
        "gpu-1",
        {
            "spec": {
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "lockstep.io/quarantine", "value": "xid-79", "effect": "NoSchedule"},
                ]
            }
        },
    )


def test_drain_cordons_then_evicts_through_the_eviction_api(cluster):
    core = FakeCore(
        pods=[
            pod("worker-0"),
            pod("dcgm", "gpu-operator", owner="DaemonSet"),
            pod("static", mirror=True),
            pod("done", phase="Succeeded"),
            pod("worker-1", owner="StatefulSet"),
        ]
    )
    driver = KubernetesDriver(cluster, core_api=core)
    result = driver.drain(make_node(cluster, "gpu-1"))
    assert core.calls[0] == ("patch_node", "gpu-1", {"spec": {"unschedulable": True}})
    assert core.calls[1] == ("list_pods", "spec.nodeName=gpu-1")
    assert [c for c in core.calls if c[0] == "evict"] == [
        ("evict", "train", "worker-0", "worker-0"),
        ("evict", "train", "worker-1", "worker-1"),
    ]
    assert not any(c[0] == "delete" for c in core.calls)
    assert driver.operation_status(result.handle) == "succeeded"
    assert driver.drain_done(make_node(cluster, "gpu-2")) is True


def test_drain_respects_a_pod_disruption_budget(cluster):
    core = FakeCore(pods=[pod("worker-0"), pod("guarded")], refuse={"guarded"})
    driver = KubernetesDriver(cluster, core_api=core)
    with pytest.raises(DriverError) as refused:
        driver.drain(make_node(cluster, "gpu-1"))
    assert (
        refused.value.transient
        and "PodDisruptionBudget" in str(refused.value)
        and "train/guarded" in str(refused.value)
    )
    assert [p.metadata.name for p in core.pods] == ["guarded"]  # evicted the rest, deleted nothing
    assert driver.operation_status("drain:gpu-1") == "running"


def test_apply_runs_helm_upgrade_install_with_values_on_stdin(cluster):
    helm = FakeHelm()
    driver = KubernetesDriver(cluster, runner=helm)
    driver.apply_addon(
        {
            "name": "gpu-operator",
            "repo": "https://helm.ngc.nvidia.com/nvidia",
            "chart": "gpu-operator",
            "version": "24.9.0",
            "namespace": "gpu-operator",
            "values": {"driver": {"enabled": False}},
        }
    )
    driver.apply_addon(
        {
            "name": "nic-failover",
            "repo": "oci://registry.example/lockstep",
            "chart": "nic-failover",
            "version": "1.2.0",
            "namespace": "lockstep",
            "values": {},
        }
    )
    (first, values), (second, _) = helm.commands
    assert first == [
        "helm",
        "upgrade",
        "--install",
        "gpu-operator",
        "gpu-operator",
        "--repo",
        "https://helm.ngc.nvidia.com/nvidia",
        "--version",
        "24.9.0",
        "--namespace",
        "gpu-operator",
        "--create-namespace",
        "--values",
        "-",
        "--output",
        "json",
        "--kubeconfig",
        "/etc/lockstep/c1.yaml",
        "--kube-context",
        "c1",
    ]
    assert json.loads(values) == {"driver": {"enabled": False}}
    assert second[3:5] == ["nic-failover", "oci://registry.example/lockstep/nic-failover"]
    assert "--repo" not in second


def test_uninstall_is_idempotent_and_failures_are_driver_errors(cluster):
    helm = FakeHelm(
        {
            "uninstall gone": CommandResult(
                1, "", "Error: uninstall: Release not loaded: gone: release: not found"
            ),
            "uninstall stuck": CommandResult(1, "", "Error: context deadline exceeded"),
        }
    )
    driver = KubernetesDriver(cluster, runner=helm)
    driver.remove_addon("gone", "default")
    with pytest.raises(DriverError):
        driver.remove_addon("stuck", "default")
    assert helm.commands[0][0][:5] == ["helm", "uninstall", "gone", "--namespace", "default"]


def test_observe_reads_helm_list_and_values_and_node_software_labels(cluster):
    releases = [
        {
            "name": "gpu-operator",
            "namespace": "gpu-operator",
            "chart": "gpu-operator-v24.9.0",
            "status": "deployed",
        },
        {
            "name": "nic-failover",
            "namespace": "lockstep",
            "chart": "nic-failover-1.2.0-rc.1",
            "status": "pending-upgrade",
        },
    ]
    helm = FakeHelm(
        {
            "list --all-namespaces": CommandResult(0, json.dumps(releases), ""),
            "get values gpu-operator": CommandResult(0, '{"driver": {"enabled": false}}', ""),
            "get values nic-failover": CommandResult(0, "null", ""),
        }
    )
    core = FakeCore(labels={"lockstep.io/node-software.cuda": "12.4"})
    observed = {o.name: o for o in KubernetesDriver(cluster, runner=helm, core_api=core).observe_addons()}
    assert observed["gpu-operator"].chart == "gpu-operator" and observed["gpu-operator"].version == "v24.9.0"
    assert observed["gpu-operator"].values == {"driver": {"enabled": False}}
    assert observed["gpu-operator"].health == HealthStatus.HEALTHY
    assert (
        observed["nic-failover"].version == "1.2.0-rc.1" and observed["nic-failover"].health == "Progressing"
    )
    assert observed["nic-failover"].values == {}
    assert observed["node-software.cuda"].version == "12.4"
    assert helm.commands[0][0][:4] == ["helm", "list", "--all-namespaces", "--output"]


def test_a_missing_helm_binary_is_a_driver_error(cluster):
    cluster.connection = {"helm": "/nonexistent/helm"}
    with pytest.raises(DriverError) as missing:
        KubernetesDriver(cluster).apply_addon({"name": "x", "chart": "x", "version": "1.0.0"})
    assert "not installed" in str(missing.value)


def test_split_chart():
    assert split_chart("gpu-operator-v24.9.0") == ("gpu-operator", "v24.9.0")
    assert split_chart("kube-prometheus-stack-65.1.1") == ("kube-prometheus-stack", "65.1.1")
    assert split_chart("odd") == ("odd", "")


def test_node_services_go_through_the_kubernetes_driver(users, cluster, monkeypatch):
    from fleet.services.nodes import node_cordon

    core = FakeCore()
    monkeypatch.setattr(KubernetesDriver, "core_api_factory", staticmethod(lambda connection: core))
    node = make_node(cluster, "gpu-1")
    node_cordon(actor=users["operator"], node=node, reason="xid 79")
    assert core.calls == [("patch_node", "gpu-1", {"spec": {"unschedulable": True}})]
