"""Benchmark: a full drift sweep over N simulated clusters x 15 add-ons, end to end (observe through the simulated
driver, compare, record, open and resolve findings), on one core; with its SQL query count for 500 and 2,000
clusters.  Run: .venv/bin/python bench/fleet_drift_sweep.py [clusters ...]"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_common  # noqa: E402

DRIFTED = 40  # clusters whose drift is resolved, and as many newly drifted, in the measured sweep


def measure(clusters: int, rounds: int = 3) -> dict:
    from statistics import median

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import DriftFinding, SimulatedAddon
    from fleet.services.drift import drift_sweep

    fleet_common.reset()
    _, _, rows = fleet_common.make_fleet(clusters)
    ids = [c.pk for c in rows]
    drifted = ids[:DRIFTED]
    SimulatedAddon.objects.filter(cluster_id__in=drifted, name="addon-03").update(version="1.0.1")
    started = time.perf_counter()
    cold = drift_sweep()  # first sweep: every observed row is new
    cold_seconds = time.perf_counter() - started
    assert cold.opened == DRIFTED, cold
    timings = []
    for round_ in range(rounds):
        # out of band: the last drift is fixed by hand, new drift appears elsewhere (a version and a value change)
        fresh = ids[(round_ + 1) * DRIFTED : (round_ + 2) * DRIFTED]
        SimulatedAddon.objects.filter(cluster_id__in=drifted, name="addon-03").update(version="1.0.0")
        SimulatedAddon.objects.filter(cluster_id__in=drifted, name="addon-07").update(
            values={"replicas": 2, "image": {"tag": "v1"}}
        )
        SimulatedAddon.objects.filter(cluster_id__in=fresh, name="addon-03").update(version="1.0.1")
        SimulatedAddon.objects.filter(cluster_id__in=fresh, name="addon-07").update(values={"replicas": 3})
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            report = drift_sweep()
            timings.append(time.perf_counter() - started)
        assert report.opened == 2 * DRIFTED and report.resolved == (
            DRIFTED if round_ == 0 else 2 * DRIFTED
        ), report
        assert DriftFinding.objects.filter(resolved_at__isnull=True).count() == 2 * DRIFTED
        drifted = fresh
    publishing = sum(
        1
        for q in queries
        if "controlplane_event" in q["sql"] or "topicsequence" in q["sql"] or "SAVEPOINT" in q["sql"]
    )
    return {
        "clusters": clusters,
        "checks": report.checks,
        "best": min(timings),
        "median": median(timings),
        "cold_seconds": cold_seconds,
        "checks_per_second": report.checks / min(timings),
        "queries": len(queries),
        "event_queries": publishing,
    }


def main():
    fleet_common.setup()
    sizes = [int(a) for a in sys.argv[1:]] or [500, 2000]
    print(
        f"drift sweep, simulated driver, 15 add-ons per cluster; each measured sweep resolves the previous "
        f"drift and opens new drift on {DRIFTED} clusters (2 findings each); one core; best and median of 3"
    )
    for size in sizes:
        r = measure(size)
        print(
            f"{r['clusters']:>6} clusters  {r['checks']:>6} checks  {r['best']:.3f} s (median {r['median']:.3f} s)  "
            f"{r['checks_per_second']:>9,.0f} checks/s  {r['queries']} SQL queries "
            f"({r['event_queries']} of them publishing events for the {2 * DRIFTED} clusters that changed)  "
            f"[first sweep, all rows new: {r['cold_seconds']:.3f} s]"
        )


if __name__ == "__main__":
    main()
