"""What a cluster has (nodes, their GPUs and NICs, racks), cached in the process so ingest does not look it up
per reading. A name the cache does not know triggers one reload before it is refused, so new hardware is
accepted at once."""

import time
from dataclasses import dataclass, field

from controlplane.errors import ServiceError
from fleet.models import GPU, NIC, Node

TTL_SECONDS = 60.0


@dataclass
class NodeEntry:
    id: int
    hostname: str
    rack: str
    gpus: dict[int, int] = field(default_factory=dict)  # index -> GPU id
    nics: dict[str, int] = field(default_factory=dict)  # name -> NIC id


@dataclass
class Inventory:
    cluster_id: int
    loaded_at: float
    nodes: dict[str, NodeEntry]
    racks: set[str]

    def node(self, hostname: str | None, where: str) -> NodeEntry:
        if not hostname:
            raise ServiceError(
                "no node named for this reading (set the batch's node or the reading's node)", field=where
            )
        entry = self.nodes.get(hostname)
        if entry is None:
            fresh = _load(self.cluster_id)
            self.nodes, self.racks, self.loaded_at = fresh.nodes, fresh.racks, fresh.loaded_at
            entry = self.nodes.get(hostname)
        if entry is None:
            raise ServiceError(f"unknown node {hostname!r} for this agent token's cluster", field=where)
        return entry

    def check_facility_target(self, scope: str, target: str, where: str) -> None:
        if scope == "node":
            self.node(target, where)
        elif scope == "rack" and target not in self.racks:
            fresh = _load(self.cluster_id)
            self.nodes, self.racks, self.loaded_at = fresh.nodes, fresh.racks, fresh.loaded_at
            if target not in self.racks:
                raise ServiceError(f"unknown rack {target!r} for this agent token's cluster", field=where)


_cache: dict[int, Inventory] = {}


def _load(cluster_id: int) -> Inventory:
    nodes = {
        row[1]: NodeEntry(id=row[0], hostname=row[1], rack=row[2])
        for row in Node.objects.filter(cluster_id=cluster_id).values_list("id", "hostname", "rack")
    }
    by_id = {entry.id: entry for entry in nodes.values()}
    for gpu_id, node_id, index in GPU.objects.filter(node__cluster_id=cluster_id).values_list(
        "id", "node_id", "index"
    ):
        by_id[node_id].gpus[index] = gpu_id
    for nic_id, node_id, name in NIC.objects.filter(node__cluster_id=cluster_id).values_list(
        "id", "node_id", "name"
    ):
        by_id[node_id].nics[name] = nic_id
    racks = {entry.rack for entry in nodes.values() if entry.rack}
    return Inventory(cluster_id=cluster_id, loaded_at=time.monotonic(), nodes=nodes, racks=racks)


def inventory_for(cluster_id: int) -> Inventory:
    cached = _cache.get(cluster_id)
    if cached is None or time.monotonic() - cached.loaded_at > TTL_SECONDS:
        cached = _cache[cluster_id] = _load(cluster_id)
    return cached


def forget(cluster_id: int | None = None) -> None:
    """Drop cached inventories (tests, or after hardware changes that must be seen at once)."""
    if cluster_id is None:
        _cache.clear()
    else:
        _cache.pop(cluster_id, None)
