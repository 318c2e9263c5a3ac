"""Prices that are measured: the planner's expected durations for a cluster come from what its completed recoveries
really took (a running average per kind), falling back to the planner's defaults until there are enough of them.
Every action records the estimates it was chosen with (``RecoveryAction.estimate``) beside what it measured."""

from dataclasses import replace

from django.conf import settings
from django.utils import timezone

from controlplane.prepared import PreparedQuery
from jobs.choices import ActionKind
from jobs.models import RecoveryEstimate
from jobs.planner import Estimates

# The estimate each kind of action measures: the seconds from its start to its end through the driver.
MEASURES = {
    ActionKind.NIC_FAILOVER: "nic_failover",
    ActionKind.LIVE_MIGRATION: "migration_pause",
    ActionKind.PROACTIVE_MIGRATION: "migration_pause",
    ActionKind.INTRA_NODE_MIGRATION: "intra_node_pause",
    ActionKind.GPU_RESET: "gpu_reset",
    ActionKind.RESTORE_FROM_SNAPSHOT: "restore_pause",
}
# A degraded stretch (failover or run degraded → failback) measures how long a link stays bad.
DEGRADED_MEASURES = {"nic": "nic_degraded_seconds", "degraded": "link_degraded_seconds"}
DURATIONS = frozenset(MEASURES.values()) | frozenset(DEGRADED_MEASURES.values())  # what is ever measured
WEIGHT = 0.3  # of each new measurement in the running average


def defaults() -> Estimates:
    return Estimates(
        nic_degraded_seconds=float(settings.NIC_REPAIR_SECONDS),
        link_degraded_seconds=float(settings.LINK_DEGRADED_SECONDS),
    )


# Read by every decision: compiled once per process.
_ESTIMATES = PreparedQuery(
    lambda cluster: RecoveryEstimate.objects.filter(cluster_id=cluster).values_list(
        "kind", "samples", "seconds"
    ),
    cluster=int,
)


def estimates_for(cluster) -> Estimates:
    """The planner's estimates for this cluster: each duration is the running average of what this cluster's
    recoveries of that kind measured once there are ``RECOVERY_ESTIMATE_MIN_SAMPLES`` of them, else the default.
    ``basis`` says which, per duration. One indexed read of a few rows."""
    base = defaults()
    needed = settings.RECOVERY_ESTIMATE_MIN_SAMPLES
    values, basis = {}, {}
    for kind, samples, seconds in _ESTIMATES.rows(cluster=cluster.pk):
        if kind not in DURATIONS:
            continue
        if samples >= needed:
            values[kind] = seconds
            basis[kind] = f"measured: average of {samples} on this cluster"
        else:
            basis[kind] = f"default ({samples} of {needed} measurements so far)"
    return replace(base, **values, basis=basis)


def chosen_with(estimates: Estimates, kind: str, impact: str) -> dict:
    """What an action records of the estimates it was chosen with: the durations its price used, and their basis."""
    names = [MEASURES[kind]] if kind in MEASURES else []
    if kind == ActionKind.NIC_FAILOVER:
        names.append(DEGRADED_MEASURES["degraded" if impact == "degraded" else "nic"])
    return {
        name: {"seconds": round(getattr(estimates, name), 3), "basis": estimates.basis_of(name)}
        for name in names
    }


def estimates_record(measured: list[tuple[int, str, float]]) -> None:
    """Fold measured durations ``(cluster id, estimate name, seconds)`` into the running averages (the first
    measurement of a kind starts it). Callers hold the cluster's lock, so there is no lost update between writers
    of one cluster."""
    measured = [(c, name, float(s)) for c, name, s in measured if name in DURATIONS and s >= 0]
    if not measured:
        return
    now = timezone.now()
    keys = {(c, name) for c, name, _ in measured}
    rows = {
        (r.cluster_id, r.kind): r
        for r in RecoveryEstimate.objects.select_for_update().filter(
            cluster_id__in={c for c, _ in keys}, kind__in={n for _, n in keys}
        )
    }
    for cluster_id, name, seconds in measured:
        row = rows.get((cluster_id, name))
        if row is None:
            row = rows[cluster_id, name] = RecoveryEstimate(
                cluster_id=cluster_id, kind=name, samples=0, seconds=seconds
            )
        row.seconds = seconds if row.samples == 0 else row.seconds + WEIGHT * (seconds - row.seconds)
        row.samples += 1
        row.last_seconds, row.updated_at = seconds, now
    RecoveryEstimate.objects.bulk_create(
        list(rows.values()),
        update_conflicts=True,
        unique_fields=["cluster", "kind"],
        update_fields=["samples", "seconds", "last_seconds", "updated_at"],
    )
