"""Benchmark: starting a rollout over 2,000 clusters (targets resolved, busy clusters checked, batches and one row
per cluster written, audited, published), on one core.  Run: .venv/bin/python bench/fleet_rollout_start.py [N]"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_common  # noqa: E402


def main():
    fleet_common.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.models import BlueprintVersion, RolloutBatch, RolloutCluster
    from fleet.services.rollouts import rollout_start

    clusters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    fleet_common.reset()
    blueprint, v1, _ = fleet_common.make_fleet(clusters)
    v2 = BlueprintVersion.objects.create(
        blueprint=blueprint, number=2, state="active", addons=[{**a, "version": "1.1.0"} for a in v1.addons]
    )
    timings = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            rollout = rollout_start(
                actor=None,
                version=v2,
                targets={"tracking": True},
                strategy={"canary": 5, "batch_size": "10%", "soak_seconds": 300},
            )
            timings.append(time.perf_counter() - started)
        rows, batches = RolloutCluster.objects.filter(rollout=rollout).count(), rollout.batches.count()
        assert rows == clusters, rows
        RolloutCluster.objects.filter(rollout=rollout).delete()
        RolloutBatch.objects.filter(rollout=rollout).delete()
        rollout.delete()
    print(
        f"rollout start over {clusters} clusters: {rows} cluster rows and {batches} batches written in "
        f"{min(timings):.3f} s (best of 3; runs {', '.join(f'{t:.3f}' for t in timings)} s), "
        f"{len(queries)} SQL queries; one core"
    )


if __name__ == "__main__":
    main()
