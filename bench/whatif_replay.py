"""What-if replay speed: a 54-day, 16,384-GPU run (llama3 profile) through Lockstep's planner, twice.

    .venv/bin/python bench/whatif_replay.py [--seeds 5]

Prints the wall time of each replay (target: under a minute) and the headline figures.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.testing.settings")  # production settings on plain HTTP


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    import django

    django.setup()
    from simulator.whatif import WhatIfConfig, whatif_run

    times = []
    for seed in range(1, args.seeds + 1):
        started = time.perf_counter()
        report = whatif_run(WhatIfConfig(seed=seed))
        times.append(time.perf_counter() - started)
        u, p = report["unprotected"], report["protected"]
        print(f"seed {seed}: {u['interruptions']} interruptions; effective training time "
              f"{u['effective_training_time']:.1%} without protection, {p['effective_training_time']:.1%} with; "
              f"GPU-hours saved {p['gpu_hours_saved']:,.0f}; replayed in {times[-1]:.3f} s")
    print(f"54-day replay (both runs): worst {max(times):.3f} s, target 60 s ({60 / max(times):,.0f}x under)")


if __name__ == "__main__":
    main()
