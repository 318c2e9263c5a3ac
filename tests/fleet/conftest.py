"""Fixtures shared by the fleet tests."""

import pytest

from fleet.services.blueprints import version_create
from fleet.services.drift import drift_sweep
from fleet.services.rollouts import rollout_start
from tests.support.blueprints import ADDONS, KUBECONFIG_SECRET, blueprint, bump, clusters_on
from tests.support.factories import make_fleet, make_node


@pytest.fixture
def world(users, tenant_a):
    """A blueprint on a fleet of three simulated clusters (one dedicated to tenant A, one drifted), each with a
    node and a kubeconfig the pages must not render, and a rollout of the blueprint's second version going."""
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    fleet = make_fleet("eu-north")
    mine = clusters_on(v1, 1, fleet=fleet, dedicated_tenant=tenant_a)[0]
    shared = clusters_on(v1, 2, fleet=fleet)
    for cluster in [mine, *shared]:
        cluster.connection = {"apply_seconds": 0, "kubeconfig": KUBECONFIG_SECRET}
        cluster.save()
        make_node(cluster)
    from fleet.drivers.simulated import simulate_drift

    simulate_drift(shared[0], addon="gpu-operator", kind="version", version="25.0.0")
    drift_sweep()
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"fleet": fleet.pk}, strategy={"batch_size": 1})
    return {"bp": bp, "mine": mine, "shared": shared, "rollout": rollout}
