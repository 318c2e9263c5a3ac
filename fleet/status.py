"""Status roll-ups: a cluster's and a fleet's status is the worst of its parts, with "x/y ready" counts."""

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count

from fleet.choices import HEALTH_RANK, SYNC_RANK, HealthStatus, SyncStatus
from fleet.models import Cluster, ObservedAddon


@dataclass(frozen=True)
class Rollup:
    sync: str
    health: str
    ready: int
    total: int
    # What the clusters' tooling says of unhealthy add-ons ("c1/gpu-operator: pending-upgrade since …").
    messages: tuple = ()

    @property
    def label(self) -> str:
        return f"{self.ready}/{self.total} ready"


def _worst(values, rank, default):
    return min(values, key=lambda v: rank.get(v, -1)) if values else default


def cluster_status(cluster_ids) -> dict[int, Rollup]:
    """Per cluster: worst sync, worst health, add-ons InSync and Healthy out of all observed (one query)."""
    parts = defaultdict(list)
    for row in (
        ObservedAddon.objects.filter(cluster_id__in=list(cluster_ids))
        .values("cluster_id", "sync", "health")
        .annotate(n=Count("id"))
        .order_by()
    ):
        parts[row["cluster_id"]].append(row)
    messages = defaultdict(list)
    for cluster_id, cluster_name, name, message in (
        ObservedAddon.objects.filter(cluster_id__in=list(cluster_ids))
        .exclude(message="")
        .order_by("cluster_id", "name")
        .values_list("cluster_id", "cluster__name", "name", "message")
    ):
        messages[cluster_id].append(f"{cluster_name}/{name}: {message}")
    out = {}
    for cluster_id in cluster_ids:
        rows = parts.get(cluster_id, [])
        ready = sum(
            r["n"] for r in rows if r["sync"] == SyncStatus.IN_SYNC and r["health"] == HealthStatus.HEALTHY
        )
        out[cluster_id] = Rollup(
            _worst([r["sync"] for r in rows], SYNC_RANK, SyncStatus.UNKNOWN),
            _worst([r["health"] for r in rows], HEALTH_RANK, HealthStatus.UNKNOWN),
            ready,
            sum(r["n"] for r in rows),
            tuple(messages.get(cluster_id, ())),
        )
    return out


def rollup(statuses) -> Rollup:
    """The worst of several clusters' roll-ups; ready counts the clusters whose every add-on is ready."""
    statuses = list(statuses)
    return Rollup(
        _worst([s.sync for s in statuses], SYNC_RANK, SyncStatus.UNKNOWN),
        _worst([s.health for s in statuses], HEALTH_RANK, HealthStatus.UNKNOWN),
        sum(1 for s in statuses if s.total and s.ready == s.total),
        len(statuses),
        tuple(message for s in statuses for message in s.messages)[:20],
    )


def fleet_status(fleet_id: int) -> Rollup:
    ids = list(Cluster.objects.filter(fleet_id=fleet_id).values_list("pk", flat=True))
    return rollup(cluster_status(ids).values())
