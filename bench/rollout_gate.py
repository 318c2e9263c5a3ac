"""Benchmark (not a timed test): the rollout fault-rate gate against Poisson noise.

For several background rates of hardware faults, simulates many harmless batches (the rate after the change is the
rate before it) and many batches whose rate triples, draws the two windows' fault counts from Poisson distributions,
and runs each through the gate's own test (``fleet.gate.rate_rose_p`` at ROLLOUT_GATE_SIGNIFICANCE, the window
before reaching back ROLLOUT_GATE_BASELINE_HOURS). Prints the false-rollback rate of harmless batches (goal < 1 %)
and the detection rate of tripled ones per soak length, the shortest soak that detects 90 % of them, and the same
figures for the gate it replaced (fail when the faults after exceed the faults in an equal window before).

Run: .venv/bin/python bench/rollout_gate.py [--trials 20000] [--nodes 144] [--seed 1] [--significance A]
     [--baseline-hours H]
"""

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DEBUG", "true")  # settings only: the bench touches no database

import django  # noqa: E402

django.setup()

import numpy as np  # noqa: E402
from django.conf import settings  # noqa: E402

from fleet.gate import rate_rose_p  # noqa: E402

# Hardware faults per node-hour. Llama 3 405B's published run: 419 unexpected interruptions in 54 days on 16,384
# GPUs (2,048 nodes), 78 % of them hardware: about 1.2e-4 per node-hour. The higher rates stand for a worse fleet
# and for counting link flaps and thermal events, which arrive far more often than interruptions.
RATES = (1.2e-4, 1e-3, 1e-2)
SOAK_HOURS = (0.5, 1, 2, 4, 8, 24)


def run(
    trials: int, nodes: int, seed: int, alpha: float | None = None, baseline_hours: float | None = None
) -> None:
    alpha = settings.ROLLOUT_GATE_SIGNIFICANCE if alpha is None else alpha
    baseline_hours = settings.ROLLOUT_GATE_BASELINE_HOURS if baseline_hours is None else baseline_hours
    rng = np.random.default_rng(seed)
    p_value = functools.lru_cache(maxsize=None)(rate_rose_p)
    print(
        f"batch of {nodes} nodes, {trials} trials per cell, significance {alpha:g}, baseline {baseline_hours:g} h "
        f"(at least the soak), seed {seed}"
    )
    print(
        f"{'rate/node-h':>11} {'soak h':>6} {'expected after':>14} | {'false rollback':>14} {'detected x3':>11} "
        f"| {'old: false':>10} {'old: detected':>13}"
    )
    worst_false = 0.0
    for rate in RATES:
        shortest = None
        for soak in SOAK_HOURS:
            baseline = max(baseline_hours, soak)
            after_exposure, before_exposure = nodes * soak, nodes * baseline
            mean_after = rate * after_exposure
            before = rng.poisson(rate * before_exposure, trials)
            harmless = rng.poisson(mean_after, trials)
            tripled = rng.poisson(3 * mean_after, trials)
            false = np.mean(
                [
                    p_value(int(a), int(b), after_exposure, before_exposure) < alpha
                    for a, b in zip(harmless, before, strict=True)
                ]
            )
            detected = np.mean(
                [
                    p_value(int(a), int(b), after_exposure, before_exposure) < alpha
                    for a, b in zip(tripled, before, strict=True)
                ]
            )
            # the old gate: faults after > faults in an equal window before
            equal_before = rng.poisson(mean_after, trials)
            old_false = np.mean(harmless > equal_before)
            old_detected = np.mean(tripled > equal_before)
            worst_false = max(worst_false, false)
            if shortest is None and detected >= 0.9:
                shortest = soak
            print(
                f"{rate:>11.1e} {soak:>6g} {mean_after:>14.3f} | {false:>13.2%} {detected:>11.1%} "
                f"| {old_false:>9.1%} {old_detected:>13.1%}"
            )
        print(
            f"{'':>11} shortest soak detecting 90 % of tripled batches: "
            f"{f'{shortest:g} h' if shortest is not None else f'more than {SOAK_HOURS[-1]} h'}"
        )
    print(f"worst false-rollback rate over every cell: {worst_false:.2%} (goal < 1 %)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument(
        "--nodes", type=int, default=144, help="nodes in the batch (the demo's fleet: 2 x 72)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--significance", type=float, help="default: the ROLLOUT_GATE_SIGNIFICANCE setting")
    parser.add_argument(
        "--baseline-hours", type=float, help="default: the ROLLOUT_GATE_BASELINE_HOURS setting"
    )
    args = parser.parse_args()
    run(args.trials, args.nodes, args.seed, args.significance, args.baseline_hours)
