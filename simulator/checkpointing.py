"""How often a job should checkpoint: Young's and Daly's optimal interval, and the effective training time at it.

Pure arithmetic, no database (docs/simulator.md, "Checkpoint advice", has the formulas):

- Young (1974): tau = sqrt(2 * delta * M), for checkpoint write cost delta and mean time between the
  interruptions that restart the job from its checkpoint M.
- Daly (2006), the higher-order estimate: tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9)
  - delta while delta < 2M, else tau = M.
- Effective training time at an interval tau, to first order: 1 - delta / tau - (tau / 2 + R) / M, where R is
  the restart overhead: every checkpoint stalls the job for delta, and every restart costs R plus, on average,
  half an interval of work redone.

With Lockstep, M is the mean time between the interruptions that still restart from the checkpoint (software
crashes, failed recoveries, whole-rack failures); the rest cost a pause and at most a snapshot interval, so a
protected job can checkpoint far less often.
"""

import math


def young_interval(*, write_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimal checkpoint interval in seconds."""
    return math.sqrt(2.0 * write_seconds * mtbf_seconds)


def daly_interval(*, write_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimal checkpoint interval in seconds (the mean time between failures when writing a
    checkpoint takes twice that or more)."""
    if write_seconds >= 2.0 * mtbf_seconds:
        return mtbf_seconds
    ratio = write_seconds / (2.0 * mtbf_seconds)
    return (
        math.sqrt(2.0 * write_seconds * mtbf_seconds) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_seconds
    )


def effective_training_time(
    *, interval_seconds: float, write_seconds: float, restart_seconds: float, mtbf_seconds: float
) -> float:
    """The first-order share of wall time spent training, checkpointing every ``interval_seconds``."""
    waste = write_seconds / interval_seconds + (interval_seconds / 2 + restart_seconds) / mtbf_seconds
    return max(0.0, 1.0 - waste)


def advice(
    *,
    mtbf_hours: float,
    write_seconds: float,
    restart_seconds: float,
    current_interval_seconds: float | None = None,
) -> dict:
    """The Young/Daly interval for one failure rate, the effective training time at it and (if given) at the
    current interval. JSON-safe; minutes and shares rounded for display."""
    mtbf = mtbf_hours * 3600.0
    daly = daly_interval(write_seconds=write_seconds, mtbf_seconds=mtbf)
    result = {
        "mtbf_hours": round(mtbf_hours, 3),
        "young_minutes": round(young_interval(write_seconds=write_seconds, mtbf_seconds=mtbf) / 60, 2),
        "daly_minutes": round(daly / 60, 2),
        "effective_training_time_at_daly": round(
            effective_training_time(
                interval_seconds=daly,
                write_seconds=write_seconds,
                restart_seconds=restart_seconds,
                mtbf_seconds=mtbf,
            ),
            4,
        ),
    }
    if current_interval_seconds:
        result["current_minutes"] = round(current_interval_seconds / 60, 2)
        result["effective_training_time_at_current"] = round(
            effective_training_time(
                interval_seconds=current_interval_seconds,
                write_seconds=write_seconds,
                restart_seconds=restart_seconds,
                mtbf_seconds=mtbf,
            ),
            4,
        )
    return result


def job_checkpoint_advice(
    *, gpus: int, protected: bool, restart_overhead_minutes: float, current_interval_seconds: float | None
) -> dict:
    """Checkpoint advice for one job of ``gpus`` GPUs, from the what-if's default fault model (the Llama 3
    profile's rate per GPU-hour, Table 5's mix) and its stated checkpoint write cost; for the job page.

    Without protection every interruption restarts the job; with it, only the share the what-if's fault model
    says Lockstep cannot save (``protected_restart_share``)."""
    from simulator.profiles import PROFILES
    from simulator.whatif import WhatIfConfig, protected_restart_share

    config = WhatIfConfig()
    mtbf = PROFILES[config.profile].mean_hours_between(max(1, gpus))
    restart = restart_overhead_minutes * 60
    without = advice(
        mtbf_hours=mtbf,
        write_seconds=config.checkpoint_write_seconds,
        restart_seconds=restart,
        current_interval_seconds=current_interval_seconds,
    )
    share = protected_restart_share(config)
    with_ = advice(
        mtbf_hours=mtbf / share,
        write_seconds=config.checkpoint_write_seconds,
        restart_seconds=restart,
        current_interval_seconds=current_interval_seconds,
    )
    return {
        "protected": protected,
        "gpus": gpus,
        "profile": config.profile,
        "checkpoint_write_seconds": config.checkpoint_write_seconds,
        "protected_restart_share": round(share, 4),
        "unprotected": without,
        "with_lockstep": with_,
        "this_job": with_ if protected else without,
    }
