"""Prices that are measured: the planner's expected durations for a cluster come from what its completed recoveries
really took (a running average per kind), falling back to the planner's defaults until there are enough of them.
Every action records the estimates it was chosen with (``RecoveryAction.estimate``) beside what it measured.

The restart baseline (what restart-from-checkpoint would cost a job, docs/gpu-hours.md) is learned the same way:
each restart Lockstep carried out for a job that reports its own progress measures the seconds from the fault to
the job's first training step after it, per cluster and job size (jobs within a factor of two in GPUs share one
average). Until ``RESTART_BASELINE_MIN_SAMPLES`` are in, the baseline is the cluster's ``restart_overhead_minutes``,
marked "assumed"."""

from dataclasses import dataclass, replace

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
# Measured from the runtime's own report (fault → first step with the standby in place), not from the driver.
RANK_REPLACEMENT_MEASURE = "rank_replacement_pause"
# A degraded stretch (failover or run degraded → failback) measures how long a link stays bad.
DEGRADED_MEASURES = {"nic": "nic_degraded_seconds", "degraded": "link_degraded_seconds"}
DURATIONS = (
    frozenset(MEASURES.values()) | frozenset(DEGRADED_MEASURES.values()) | {RANK_REPLACEMENT_MEASURE}
)  # what is ever measured, besides the restart costs by size (``restart_kind``)
WEIGHT = 0.3  # of each new measurement in the running average
RESTART_PREFIX = "restart_g"


def restart_kind(gpus: int) -> str:
    """The estimate a restart of a job of ``gpus`` GPUs measures: jobs within a factor of two in size share one
    (``restart_g8``: 8 to 15 GPUs)."""
    return f"{RESTART_PREFIX}{1 << (max(1, int(gpus)).bit_length() - 1)}"


def _measured(name: str) -> bool:
    return name in DURATIONS or (name.startswith(RESTART_PREFIX) and name[len(RESTART_PREFIX) :].isdigit())


@dataclass(frozen=True)
class RestartBaseline:
    """The restart overhead a job's baseline is priced with, and whether it was measured or assumed."""

    seconds: float
    measured: bool
    samples: int  # restarts measured on this cluster for jobs of this size
    needed: int  # RESTART_BASELINE_MIN_SAMPLES
    size: int  # jobs of ``size`` to ``2 × size − 1`` GPUs
    assumed_seconds: float  # the cluster's setting

    @property
    def basis(self) -> str:
        return "measured" if self.measured else "assumed"

    @property
    def detail(self) -> str:
        sizes = f"jobs of {self.size}–{2 * self.size - 1} GPUs" if self.size > 1 else "jobs of 1 GPU"
        if self.measured:
            return (
                f"measured: {self.seconds:.1f} s from fault to first step, average of {self.samples} restarts "
                f"on this cluster ({sizes})"
            )
        return (
            f"assumed: {self.seconds:.0f} s, the cluster's restart overhead setting ({self.samples} of "
            f"{self.needed} restarts measured on this cluster for {sizes})"
        )

    def as_dict(self) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "basis": self.basis,
            "samples": self.samples,
            "needed": self.needed,
            "detail": self.detail,
        }


def restart_baseline(estimates: Estimates, *, gpus: int, assumed_seconds: float) -> RestartBaseline:
    """The restart overhead for a job of ``gpus`` GPUs on the cluster ``estimates`` were read for: the running
    average of the restarts measured there for jobs of its size once there are RESTART_BASELINE_MIN_SAMPLES, else
    the cluster's setting, assumed. Three because each is a real failure (a cluster sees few), and fewer would let
    one restart that waited in Slurm's queue set every job's baseline."""
    needed = max(1, int(settings.RESTART_BASELINE_MIN_SAMPLES))
    kind = restart_kind(gpus)
    samples, seconds = estimates.restarts.get(kind, (0, 0.0))
    size = int(kind[len(RESTART_PREFIX) :])
    if samples >= needed:
        return RestartBaseline(seconds, True, samples, needed, size, assumed_seconds)
    return RestartBaseline(assumed_seconds, False, samples, needed, size, assumed_seconds)


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
    values, basis, restarts = {}, {}, {}
    for kind, samples, seconds in _ESTIMATES.rows(cluster=cluster.pk):
        if kind.startswith(RESTART_PREFIX):
            restarts[kind] = (samples, seconds)
            continue
        if kind not in DURATIONS:
            continue
        if samples >= needed:
            values[kind] = seconds
            basis[kind] = f"measured: average of {samples} on this cluster"
        else:
            basis[kind] = f"default ({samples} of {needed} measurements so far)"
    return replace(base, **values, basis=basis, restarts=restarts)


def restart_baselines_of(cluster) -> dict[str, tuple[int, float]]:
    """The restart costs measured on ``cluster``, by job size: estimate name → (samples, seconds)."""
    return {
        kind: (samples, seconds)
        for kind, samples, seconds in RecoveryEstimate.objects.filter(
            cluster_id=cluster.pk, kind__startswith=RESTART_PREFIX
        ).values_list("kind", "samples", "seconds")
    }


def restart_baseline_of(job, *, measured: dict | None = None) -> RestartBaseline:
    """The restart baseline a fault of ``job`` would be priced with now (the job page, the API); ``measured``:
    its cluster's ``restart_baselines_of``, when the caller read them for many jobs."""
    if measured is None:
        measured = restart_baselines_of(job.cluster)
    return restart_baseline(
        replace(defaults(), restarts=measured),
        gpus=job.gpus,
        assumed_seconds=job.cluster.restart_overhead_minutes * 60.0,
    )


def chosen_with(estimates: Estimates, kind: str, impact: str) -> dict:
    """What an action records of the estimates it was chosen with: the durations its price used, and their basis."""
    names = [MEASURES[kind]] if kind in MEASURES else []
    if kind == ActionKind.RANK_REPLACEMENT:
        names.append(RANK_REPLACEMENT_MEASURE)
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
    measured = [(c, name, float(s)) for c, name, s in measured if _measured(name) and s >= 0]
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
