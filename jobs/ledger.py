"""The GPU-hours ledger: the formula users rely on, written down once in docs/gpu-hours.md (and DESIGN).

Counted from the moment the fault was detected, for a job of G GPUs:

    baseline = G × (time since the last checkpoint + restart overhead)
    actual   = G × (pause + work lost since the restore point used + slowdown × time degraded
                  + snapshot overhead: training time the job's in-memory snapshots cost since its previous recovery)
    saved    = baseline − actual

Times are in seconds here and GPU-hours come out (÷ 3600).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Ledger:
    baseline: float
    actual: float

    @property
    def saved(self) -> float:
        return self.baseline - self.actual


def baseline_gpu_hours(
    *, gpus: int, seconds_since_checkpoint: float, restart_overhead_seconds: float
) -> float:
    """What restart-from-checkpoint would lose: every GPU redoes the work since the checkpoint and waits out
    the restart (docs/gpu-hours.md)."""
    return gpus * (max(0.0, seconds_since_checkpoint) + max(0.0, restart_overhead_seconds)) / 3600.0


def actual_gpu_hours(
    *,
    gpus: int,
    pause_seconds: float,
    work_lost_seconds: float = 0.0,
    degraded_seconds: float = 0.0,
    slowdown: float = 0.0,
    overhead_seconds: float = 0.0,
) -> float:
    """What a recovery loses: the pause (from detection until the job runs again), the work redone since the
    restore point used, the fraction of speed lost while degraded, and what the snapshots it restored from cost
    the job while it trained (measured by the runtime; docs/gpu-hours.md)."""
    return (
        gpus
        * (
            max(0.0, pause_seconds)
            + max(0.0, work_lost_seconds)
            + max(0.0, degraded_seconds) * max(0.0, slowdown)
            + max(0.0, overhead_seconds)
        )
        / 3600.0
    )


def ledger(
    *,
    gpus: int,
    seconds_since_checkpoint: float,
    restart_overhead_seconds: float,
    pause_seconds: float,
    work_lost_seconds: float = 0.0,
    degraded_seconds: float = 0.0,
    slowdown: float = 0.0,
    overhead_seconds: float = 0.0,
) -> Ledger:
    return Ledger(
        baseline=baseline_gpu_hours(
            gpus=gpus,
            seconds_since_checkpoint=seconds_since_checkpoint,
            restart_overhead_seconds=restart_overhead_seconds,
        ),
        actual=actual_gpu_hours(
            gpus=gpus,
            pause_seconds=pause_seconds,
            work_lost_seconds=work_lost_seconds,
            degraded_seconds=degraded_seconds,
            slowdown=slowdown,
            overhead_seconds=overhead_seconds,
        ),
    )


def expected_saving(saving: float, *, score: float | None) -> tuple[float, str]:
    """A proactive move's expected GPU-hours saved until its prediction is settled: the saving it would be worth
    if the node failed, weighted by the measured precision of predictions of that score band (or, until enough
    are judged, the stated prior PROACTIVE_PRECISION_PRIOR). Returns the figure and its assumption, in words."""
    from jobs import hooks

    precision, basis = hooks.prediction_precision(score)
    return max(
        0.0, saving
    ) * precision, f"{max(0.0, saving):.2f} GPU-h if the node fails × precision {precision:.2f} ({basis})"


def restart_bases(actions) -> list[dict]:
    """The restart overheads the baselines of these actions were priced with, each once: seconds, basis
    (``measured`` on the cluster for jobs of that size, or ``assumed``: the cluster's setting) and its detail, as
    each action recorded it when it was chosen (``RecoveryAction.estimate``)."""
    found: dict[tuple, dict] = {}
    for action in actions:
        overhead = (action.estimate or {}).get("restart_overhead")
        if isinstance(overhead, dict) and action.gpu_hours_baseline:
            found.setdefault((overhead.get("basis"), overhead.get("seconds")), overhead)
    return list(found.values())
