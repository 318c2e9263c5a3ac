"""The what-if's sensitivity table through the real path (issue 20): each row moves one assumption of the run that
went through Lockstep's own services, and says how its figure was got.

- **Re-costed** (no second replay): rows that change only what a recorded decision costs. The replay recorded, for
  the job, its running hours, the work each kind of recovery redid, its degraded slowdown and how many recoveries of
  each kind succeeded; a price row books those again at its value:
  - checkpoint write cost: the stalls, one write per checkpoint interval of running time;
  - checkpoint interval: the stalls, and the work the restarts from checkpoint redid scaled by the interval's ratio
    (a fault strikes at a uniform moment between checkpoints, so the expected work redone is half the interval);
  - restart overhead: each restart that succeeded pauses the job for the new overhead instead of the old;
  - migration pause: each live migration that succeeded pauses the job for the new pause.
  The decisions themselves stay what they were: a price moved this way would not have changed any of them (the
  planner's costs do depend on the pause, so at the extremes it might have chosen otherwise; the report says so).
- **Replayed** (``replay=True``): rows that change what there is to decide with, or what strikes: the spare share,
  the repair time, the failed-recovery share, the share of rack failures and the software-crash share. Each value is
  a whole real-path replay of its own, at the run's own scale, on a fresh scratch store: the replays are shared out
  over two scratch processes (this machine has two cores), the main one first, and each process prepares its store
  once (the schema copied, not migrated again). They are the costly part (about as long as the main run each), so they run only when asked
  (``--real-path-sensitivity``). They are not replayed on a smaller cluster scaled up: a rack is 8 nodes whatever
  the cluster's size, so a smaller cluster with the same spare share has too few spares for a rack (at 1,024 GPUs
  and 2 %, 2 spares), and its spare and rack rows would say what a small cluster suffers, not this one.

The work lost per migration off a dead node has no row here: the real path does not assume it, the product books
the work since the job's last snapshot from its own progress.
"""

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from simulator.replay import run_in_scratch_many
from simulator.whatif import WhatIfConfig
from simulator.whatif_assumptions import SENSITIVITY, value_of

RECOSTED = (
    "migration_pause_seconds",
    "checkpoint_minutes",
    "restart_overhead_minutes",
    "checkpoint_write_seconds",
)
REPLAYED = (
    "spare_fraction",
    "repair_hours",
    "software_crash_share",
    "failed_recovery_share",
    "rack_failure_share",
)
CASES = ("pessimistic", "optimistic")
PARALLEL_REPLAYS = 2  # scratch processes at once (this machine has two cores)
# The largest run the real path replays, in GPU-days: twice the 54 days at 16,384 GPUs (about 840
# interruptions, a minute or two through the services on two cores). A larger run keeps the formula's figures.
MAX_GPU_DAYS = 2 * 16_384 * 54


def recost(real: dict, config: WhatIfConfig, field: str, value: float) -> float:
    """The real path's protected effective training time with the price ``field`` at ``value``, from what the
    replay recorded (``real``): its decisions as they were, each booked at the new price."""
    if field not in RECOSTED:
        raise ValueError(f"{field} is not a price of the real path")
    wall = config.days * 24
    kinds = real["by_kind"]
    restarts = kinds.get("restart_from_checkpoint", {"succeeded": 0, "work_redone_hours": 0.0})
    migrations = kinds.get("live_migration", {"succeeded": 0})["succeeded"]
    running, work = real["running_hours"], real["work_redone_hours"]
    interval, write = config.checkpoint_minutes, config.checkpoint_write_seconds
    if field == "restart_overhead_minutes":
        running -= restarts["succeeded"] * (value - config.restart_overhead_minutes) / 60
    elif field == "migration_pause_seconds":
        running -= migrations * (value - config.migration_pause_seconds) / 3600
    elif field == "checkpoint_minutes":
        work += restarts["work_redone_hours"] * (value / config.checkpoint_minutes - 1)
        interval = value
    else:
        write = value
    stalls = running * 60 / interval * write / 3600
    return round(max(0.0, running - work - stalls - real["slowed_hours"]) / wall, 4)


def _replayed_cases(fields) -> list[tuple[str, str, float]]:
    return [
        (row.field, case, getattr(row, case)) for row in SENSITIVITY if row.field in fields for case in CASES
    ]


def real_path_runs(
    config: WhatIfConfig, *, replay: bool | tuple[str, ...] = False, run_many=run_in_scratch_many
) -> dict:
    """The real-path report for ``config`` with its ``sensitivity`` rows: the price rows re-costed, and with
    ``replay`` the capacity rows replayed (all of REPLAYED, or the ones named). The replays are shared out over
    PARALLEL_REPLAYS scratch processes, the main run first in the first; each process prepares its store once
    and replays its share one after another on a fresh copy."""
    fields = REPLAYED if replay is True else tuple(replay or ())
    if unknown := set(fields) - set(REPLAYED):
        raise ValueError(f"not a replayed row: {', '.join(sorted(unknown))}")
    cases = _replayed_cases(fields)
    configs = [config] + [replace(config, **{field: value}) for field, _, value in cases]
    shares = [
        list(range(n, len(configs), PARALLEL_REPLAYS)) for n in range(min(PARALLEL_REPLAYS, len(configs)))
    ]
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        futures = [pool.submit(run_many, [configs[i] for i in share], timeout=3600) for share in shares]
        reports = {
            i: report
            for share, future in zip(shares, futures, strict=True)
            for i, report in zip(share, future.result(), strict=True)
        }
    real = reports[0]
    replayed = {
        (field, case): reports[i]["effective_training_time"] for i, (field, case, _) in enumerate(cases, 1)
    }
    rows = []
    for row in SENSITIVITY:
        if row.field in RECOSTED:
            how = "re-costed"
            figure = {case: recost(real, config, row.field, getattr(row, case)) for case in CASES}
        elif (row.field, "pessimistic") in replayed:
            how = "replayed"
            figure = {case: replayed[(row.field, case)] for case in CASES}
        else:
            continue
        rows.append(
            {
                "assumption": row.label,
                "field": row.field,
                "unit": row.unit,
                "value": value_of(config, row.field),
                "how": how,
                **{case: {"value": getattr(row, case), "protected": figure[case]} for case in figure},
            }
        )
    real["sensitivity"] = rows
    return real


def not_replayed(config: WhatIfConfig) -> str:
    """Why the real path leaves ``config`` out (empty when it replays it)."""
    if config.gpus * config.days > MAX_GPU_DAYS:
        return (
            f"{config.gpus:,} GPUs for {config.days:g} days is more than the real path replays "
            f"({MAX_GPU_DAYS:,} GPU-days); the formula's figures stand alone"
        )
    return ""


def real_path_beside(config: WhatIfConfig, *, replay: bool | tuple[str, ...] = False) -> Future:
    """``real_path_runs`` started in a thread, so that its scratch processes run beside the caller's own work (the
    formula replay); returns its future. A run too large for the real path (``not_replayed``) is not started: the
    future holds ``{"not_replayed": why}``."""
    if why := not_replayed(config):
        done: Future = Future()
        done.set_result({"not_replayed": why})
        return done
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(real_path_runs, config, replay=replay)
    pool.shutdown(wait=False)
    return future
