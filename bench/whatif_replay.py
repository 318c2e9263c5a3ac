"""What-if speed: the whole `manage.py simulate what-if` report for 54 days on 16,384 GPUs (llama3 profile) —
both replays, the sensitivity table (two replay pairs per row) and the Young/Daly advice (one more pair) —
in-process, no Celery worker.

    .venv/bin/python bench/whatif_replay.py [--seeds 5]

Prints each seed's headline figures with their sensitivity spread and the wall time of the whole report
(target: under 60 s).
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault(
    "DJANGO_SETTINGS_MODULE", "controlplane.testing.settings"
)  # production settings on plain HTTP


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
        low = min(row["pessimistic"]["protected"] for row in report["sensitivity"])
        high = max(row["optimistic"]["protected"] for row in report["sensitivity"])
        advice = report["checkpoint_advice"]
        print(
            f"seed {seed}: {u['interruptions']} interruptions; effective training time "
            f"{u['effective_training_time']:.1%} without protection, {p['effective_training_time']:.1%} with "
            f"(sensitivity {low:.1%}-{high:.1%}); Young/Daly {advice['unprotected']['daly_minutes']:.0f} / "
            f"{advice['protected']['daly_minutes']:.0f} min; whole report in {times[-1]:.2f} s"
        )
    replays = 2 * (2 + 2 * len(report["sensitivity"]) + 2)
    print(
        f"54 days x 16,384 GPUs, {replays} replays a report: worst {max(times):.2f} s, target 60 s "
        f"({60 / max(times):,.0f}x under)"
    )


if __name__ == "__main__":
    main()
