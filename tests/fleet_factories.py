"""Factories for a small fleet: used by the fleet, jobs and telemetry tests."""

import itertools
import uuid

from fleet.choices import NodeState
from fleet.models import GPU, NIC, Blueprint, BlueprintVersion, Cluster, Fleet, Node

_n = itertools.count(1)


def make_fleet(name: str | None = None, **fields) -> Fleet:
    # Test fleets hold a handful of nodes, where the share circuit breaker's default (20 %, at least one node)
    # would refuse a second cordon; it is off here unless a test sets it (tests/fleet/test_node_services.py).
    fields.setdefault("max_disrupted_percent", 100)
    return Fleet.objects.create(name=name or f"fleet-{next(_n)}", **fields)


def make_cluster(fleet: Fleet | None = None, name: str | None = None, **fields) -> Cluster:
    return Cluster.objects.create(fleet=fleet or make_fleet(), name=name or f"cluster-{next(_n)}", **fields)


def make_node(cluster: Cluster, hostname: str | None = None, *, gpus: int = 8, nics: int = 8, gpu_model: str = "H100",
              leaf: str = "leaf-1", rack: str = "rack-1", state: str = NodeState.READY) -> Node:
    node = Node.objects.create(cluster=cluster, hostname=hostname or f"node-{next(_n)}", gpu_model=gpu_model,
                               leaf_switch=leaf, rack=rack, spine_switch="spine-1", state=state)
    GPU.objects.bulk_create([GPU(node=node, index=i, uuid=f"GPU-{uuid.uuid4()}", model=gpu_model) for i in range(gpus)])
    NIC.objects.bulk_create([NIC(node=node, name=f"mlx5_{i}", rail=i, switch_port=f"{leaf}/p{i}") for i in range(nics)])
    return node


def make_blueprint(name: str | None = None, *, protection: bool = False, **fields) -> tuple[Blueprint, BlueprintVersion]:
    blueprint = Blueprint.objects.create(name=name or f"bp-{next(_n)}", **fields)
    addons = [{"name": "gpu-operator", "repo": "https://helm.ngc.nvidia.com/nvidia", "chart": "gpu-operator",
               "version": "24.9.0", "namespace": "gpu-operator", "values": {}}]
    if protection:
        addons += [
            {"name": "nic-failover", "repo": "oci://registry.example/lockstep", "chart": "nic-failover",
             "version": "1.2.0", "namespace": "lockstep", "values": {}},
            {"name": "live-migration", "repo": "oci://registry.example/lockstep", "chart": "live-migration",
             "version": "1.2.0", "namespace": "lockstep", "values": {}},
        ]
    version = BlueprintVersion.objects.create(
        blueprint=blueprint, number=1, state="active", addons=addons,
        policy={"protection": {"nic_failover": protection, "live_migration": protection}},
    )
    return blueprint, version
