"""Shared set-ups for the fleet tests: a blueprint with a few add-ons and simulated clusters that carry it."""

from datetime import timedelta

from django.utils import timezone

from fleet.models import Blueprint, Cluster, SimulatedAddon
from fleet.services.blueprints import blueprint_create, version_create
from tests.support.factories import make_cluster, make_fleet

ADDONS = [
    {
        "name": "gpu-operator",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
        "chart": "gpu-operator",
        "version": "24.9.0",
        "namespace": "gpu-operator",
        "values": {"driver": {"enabled": True}},
    },
    {
        "name": "network-operator",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
        "chart": "network-operator",
        "version": "24.7.0",
        "namespace": "network-operator",
        "values": {},
    },
    {
        "name": "nic-failover",
        "repo": "oci://registry.example/lockstep",
        "chart": "nic-failover",
        "version": "1.2.0",
        "namespace": "lockstep",
        "values": {"mode": "active-backup"},
    },
]

# A kubeconfig the fleet pages must never render: the clusters of tests/fleet/conftest.py's `world` carry it.
KUBECONFIG_SECRET = "do-not-render-this-kubeconfig"


def bump(addons, name, version):
    return [{**a, "version": version} if a["name"] == name else a for a in addons]


def blueprint(
    actor,
    name="gpu-base",
    *,
    auto_rollout=True,
    strategy=None,
    drift_mode="notify",
    addons=ADDONS,
    node_software=None,
) -> tuple[Blueprint, object]:
    bp = blueprint_create(
        actor=actor,
        name=name,
        auto_rollout=auto_rollout,
        drift_mode=drift_mode,
        default_strategy=strategy or {"batch_size": 2, "soak_seconds": 0, "max_failures": 0},
    )
    v1 = version_create(
        actor=actor,
        blueprint=bp,
        addons=addons,
        node_software=node_software or {},
        policy={"protection": {"nic_failover": True}},
        activate=True,
    )
    return bp, v1


def clusters_on(version, count=4, *, fleet=None, track_latest=True, **fields) -> list[Cluster]:
    """Simulated clusters that already carry ``version`` (its add-ons installed and healthy)."""
    from fleet.desired import desired_state

    fleet = fleet or make_fleet()
    out = []
    past = timezone.now() - timedelta(seconds=1)
    for _ in range(count):
        cluster = make_cluster(
            fleet,
            blueprint=version.blueprint,
            blueprint_version=version,
            track_latest=track_latest,
            connection={"apply_seconds": 0},
            **fields,
        )
        SimulatedAddon.objects.bulk_create(
            [
                SimulatedAddon(
                    cluster=cluster,
                    name=spec["name"],
                    chart=spec["chart"],
                    version=spec["version"],
                    namespace=spec["namespace"],
                    values=spec["values"],
                    ready_at=past,
                )
                for spec in desired_state(version).values()
            ]
        )
        out.append(cluster)
    return out
