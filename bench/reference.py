"""The CPU reference the benchmarks print beside their figures: a fixed piece of pure Python (``sum(range(10**6))``),
so that runs on different machines, or on one machine in faster and slower minutes, can be compared."""

import statistics
import time


def cpu_reference_samples(samples: int = 5, pause: float = 0.3) -> list[tuple[float, float]]:
    """The CPU reference, ``samples`` times ``pause`` seconds apart: each the best of 3 runs of a fixed piece of pure
    Python, as wall-clock and as CPU milliseconds. Per-fault CPU scales with it, so runs on different machines can be
    compared; on a quiet machine the two are equal, on a busy one the wall clock also counts waiting for a core.

    On a shared VM this machine's speed moves by a third within minutes (the same process took 13 to 20 ms a few
    seconds apart, 2026-12-03), so a benchmark samples it several times around what it measures, on the quiet
    machine, and takes the median (``reference_of``)."""
    import timeit

    found = []
    for i in range(samples):
        if i:
            time.sleep(pause)
        wall = min(timeit.repeat("sum(range(10**6))", number=1, repeat=3)) * 1000
        cpu = min(timeit.repeat("sum(range(10**6))", number=1, repeat=3, timer=time.process_time)) * 1000
        found.append((wall, cpu))
    return found


def reference_of(samples: list[tuple[float, float]]) -> dict[str, float]:
    """The median and range of sampled references (wall-clock and CPU milliseconds)."""
    walls, cpus = [w for w, _ in samples], [c for _, c in samples]
    return {
        "wall": statistics.median(walls),
        "cpu": statistics.median(cpus),
        "low": min(cpus),
        "high": max(cpus),
    }
