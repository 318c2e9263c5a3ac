"""Ordering: add-ons ``depends_on`` others; they are applied after them and removed before them, and in a rollout an
add-on waits (its row says for what) until what it depends on is InSync and Healthy."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.choices import RolloutClusterStatus
from fleet.drivers.simulated import SimulatedDriver
from fleet.models import Rollout, SimulatedAddon
from fleet.services.applying import apply_version
from fleet.services.blueprints import version_create
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_start
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on

pytestmark = pytest.mark.django_db


def _chain(addons):
    """nic-failover needs network-operator, which needs gpu-operator."""
    needs = {"network-operator": ["gpu-operator"], "nic-failover": ["network-operator"]}
    return [{**a, "depends_on": needs[a["name"]]} if a["name"] in needs else a for a in addons]


def _reversed_by_name(addons):
    return sorted(addons, key=lambda a: a["name"], reverse=True)


@pytest.fixture
def recorded(monkeypatch):
    calls = []
    apply, remove = SimulatedDriver.apply_addon, SimulatedDriver.remove_addon
    monkeypatch.setattr(
        SimulatedDriver,
        "apply_addon",
        lambda self, addon: calls.append(("apply", addon["name"])) or apply(self, addon),
    )
    monkeypatch.setattr(
        SimulatedDriver,
        "remove_addon",
        lambda self, name, namespace="": calls.append(("remove", name)) or remove(self, name, namespace),
    )
    return calls


def test_a_chain_is_applied_in_order_and_removed_in_reverse(users, recorded):
    actor = users["operator"]
    bp, v1 = blueprint(actor, addons=_reversed_by_name(_chain(ADDONS)), auto_rollout=False)
    cluster = clusters_on(v1, 1)[0]
    SimulatedAddon.objects.filter(cluster=cluster).delete()
    apply_version(cluster=cluster, version=v1, previous=None)
    assert recorded == [("apply", "gpu-operator"), ("apply", "network-operator"), ("apply", "nic-failover")]
    v2 = version_create(actor=actor, blueprint=bp, node_software={"cuda": "12.4"}, activate=True)
    recorded.clear()
    apply_version(cluster=cluster, version=v2, previous=v1)
    removed = [name for op, name in recorded if op == "remove"]
    assert removed == ["nic-failover", "network-operator", "gpu-operator"]


def test_a_dependent_waits_in_a_rollout_until_its_dependency_is_healthy(users, recorded):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    cluster = clusters_on(v1, 1)[0]
    cluster.connection = {"apply_seconds": 600}
    cluster.save()
    newer = bump(bump(_chain(ADDONS), "gpu-operator", "24.9.1"), "network-operator", "24.7.1")
    v2 = version_create(actor=actor, blueprint=bp, addons=newer, activate=True)
    rollout = rollout_start(
        actor=actor, version=v2, targets={"clusters": [cluster.pk]}, strategy={"soak_seconds": 0}
    )
    rollout_step(rollout_id=rollout.pk)
    rollout_step(rollout_id=rollout.pk)
    row = rollout.clusters.get(cluster=cluster)
    assert row.status == RolloutClusterStatus.PROGRESSING
    assert "network-operator waits for gpu-operator" in row.reason
    assert ("apply", "network-operator") not in recorded
    assert SimulatedAddon.objects.get(cluster=cluster, name="network-operator").version == "24.7.0"
    rollout_step(rollout_id=rollout.pk)  # still Progressing: still waiting
    assert ("apply", "network-operator") not in recorded
    assert "gpu-operator (InSync/Progressing)" in rollout.clusters.get(cluster=cluster).reason
    past = timezone.now() - timedelta(seconds=1)
    SimulatedAddon.objects.filter(cluster=cluster, name="gpu-operator").update(ready_at=past)
    rollout_step(rollout_id=rollout.pk)
    assert ("apply", "network-operator") in recorded
    assert SimulatedAddon.objects.get(cluster=cluster, name="network-operator").version == "24.7.1"
    SimulatedAddon.objects.filter(cluster=cluster).update(ready_at=past)
    for _ in range(10):
        rollout_step(rollout_id=rollout.pk)
    assert rollout.clusters.get(cluster=cluster).status == RolloutClusterStatus.SUCCEEDED
    assert Rollout.objects.get(pk=rollout.pk).state == "Succeeded"


@pytest.mark.parametrize(
    "addons, message",
    [
        ([{**ADDONS[0], "depends_on": ["cert-manager"]}], "which the version does not carry"),
        (
            [
                {**ADDONS[0], "depends_on": [ADDONS[1]["name"]]},
                {**ADDONS[1], "depends_on": [ADDONS[0]["name"]]},
            ],
            "depends_on loops",
        ),
    ],
)
def test_unknown_or_looping_dependencies_are_refused_at_activation(users, addons, message):
    bp, _ = blueprint(users["operator"], auto_rollout=False)
    draft = version_create(actor=users["operator"], blueprint=bp, addons=addons)
    with pytest.raises(ServiceError) as refused:
        from fleet.services.blueprints import version_activate

        version_activate(actor=users["operator"], version=draft)
    assert message in str(refused.value.detail) and refused.value.field == "addons"


@pytest.mark.parametrize("depends_on", ["gpu-operator", ["Bad Name"], ["network-operator"] * 21, [3]])
def test_bad_depends_on_is_refused_naming_the_field(users, depends_on):
    bp, _ = blueprint(users["operator"])
    with pytest.raises(ServiceError) as refused:
        version_create(
            actor=users["operator"], blueprint=bp, addons=[{**ADDONS[1], "depends_on": depends_on}]
        )
    assert refused.value.field == "addons[0].depends_on"
