"""Issue 20's figure: the what-if's interruptions through Lockstep's own services, timed per interruption.

    .venv/bin/python bench/whatif_real_path.py                       # 16,384 GPUs, 54 days (about 420 strikes)
    .venv/bin/python bench/whatif_real_path.py --gpus 2048 --seed 3

Runs ``simulator.replay`` (what ``manage.py simulate what-if --real-path`` adds to the report) in its scratch process:
one protected cluster and one job in an in-memory SQLite database, the sampled interruptions through fault intake,
the decision and beat's recovery step on a ``time-machine`` clock, repairs and links coming back between them. Prints
the wall time of the whole run, the replay's time per interruption, and what the product recorded.
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spare-fraction", type=float, default=0.02)
    parser.add_argument("--repair-hours", type=float, default=24.0, help="mean repair time (exponential)")
    args = parser.parse_args()
    import os

    import django

    os.environ["DJANGO_SETTINGS_MODULE"] = "simulator.replay_settings"  # this process only reads the config
    django.setup()

    from simulator.replay import run_in_scratch
    from simulator.whatif import WhatIfConfig

    config = WhatIfConfig(
        seed=args.seed,
        gpus=args.gpus,
        days=args.days,
        spare_fraction=args.spare_fraction,
        repair_hours=args.repair_hours,
    )
    started = time.perf_counter()
    report = run_in_scratch(config, timeout=1800)
    wall = time.perf_counter() - started
    timing = report["timing"]
    print(
        f"{args.gpus} GPUs, {args.days:g} days, seed {args.seed}: {report['replayed']} of "
        f"{report['interruptions']} interruptions replayed; recoveries {report['recoveries']}, "
        f"{report['recoveries_open_at_end']} open at the end; the job ends {report['job_state'].lower()}"
    )
    print(
        f"wall {wall:.1f} s (world and schema {timing['world_seconds']:.1f} s, replay {timing['replay_seconds']:.1f} s): "
        f"{timing['ms_per_interruption']:.0f} ms per interruption (intake and decision median "
        f"{timing['intake_and_decision_ms_median']:.0f} ms)"
    )
    print(
        f"recorded: effective training time {report['effective_training_time']:.1%}; running "
        f"{report['running_hours']:.1f} h, recovering {report['recovering_hours']:.1f} h, degraded "
        f"{report['degraded_hours']:.1f} h, work redone {report['work_redone_hours']:.1f} h; GPU-hours lost "
        f"{report['gpu_hours_lost']:,.0f} against a restart baseline of {report['gpu_hours_baseline']:,.0f}; "
        f"{report['nodes_repaired']} nodes repaired, {report['links_failed_back']} links failed back"
    )
    print(f"actions: {report['actions']}")
    print(
        f"precursors: {report['precursors_shown']} of {report['precursors']} shown "
        f"{report['precursor_lead_hours']:g} h ahead; {report['predictions']} predictions, "
        f"{report['predictions_came_true']} came true, {report['predictions_held']} held"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
