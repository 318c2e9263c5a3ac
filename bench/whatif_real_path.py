"""Issue 20's measurement: a what-if's sampled interruptions through the product's own services, on a virtual clock.

    .venv/bin/python bench/whatif_real_path.py                       # 16,384 GPUs, 54 days (about 420 strikes)
    .venv/bin/python bench/whatif_real_path.py --gpus 2048 --days 7 --limit 40

Not yet the what-if (``manage.py simulate what-if`` still replays through the planner's pure functions): this is the
loop the real-path replay would run, timed (docs/benchmarks.md, "What-if replay"). It builds one protected cluster (the job's nodes and 2 % spares) and one
job on all of them in a scratch store (an embedded in-memory SQLite database the run creates and throws away; the
live fleet's rows cannot be reached from it), samples the interruptions the what-if samples (``FaultSampler``, same
profile and seed), and for each one in turn moves the clock to it (``time-machine``: every ``timezone.now()`` of the
product reads it), reports it through fault intake (``fault_ingest``; the decision runs in-process, Celery eager),
then moves the clock to each due recovery step and runs beat's recovery step (``recovery_advance``) until the
recovery has ended. It prints the time per interruption, split by phase, and the recovery kinds chosen.

What it leaves out, which the what-if needs on top: repairs and the return of failed nodes to the spare pool
(they stay failed, so spares run out), predictions from the precursors, the unprotected baseline and the ledger's
figures, the sensitivity table. Redis (``BENCH_REDIS_URL``, default DB 9) carries the decision's marks and events.
"""

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

START = datetime(2026, 1, 5, tzinfo=UTC)


def setup_django(redis_url: str) -> None:
    os.environ["DATABASE_URL"] = "sqlite://:memory:"
    os.environ["REDIS_URL"] = redis_url
    os.environ["CELERY_ALWAYS_EAGER"] = "true"
    os.environ.setdefault("DEBUG", "true")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    import django

    django.setup()


def build(gpus: int, spare_fraction: float):
    from tests.support.factories import make_tenant
    from tests.support.jobs import protected_cluster, submit

    nodes = gpus // 8
    spares = max(1, int(nodes * spare_fraction))
    cluster = protected_cluster(
        nodes=nodes,
        spares=spares,
        connection={
            "migration_pause_seconds": 30,
            "nic_failover_seconds": 2,
            "restart_seconds": 600,
            "gpu_reset_seconds": 60,
            "snapshot_base_seconds": 5,
            "health_check_seconds": 30,
        },
    )
    job = submit(cluster, make_tenant("replay"), gpus=gpus, name="training-run", checkpoint_interval=1800)
    return cluster, job


def fault_of(strike, job) -> dict | None:
    """The fault report a strike makes, on the node that holds its GPU's rank now."""
    from jobs.models import JobAllocation

    rank = strike.gpu
    allocation = (
        JobAllocation.objects.filter(
            job=job, released_at__isnull=True, rank_start__lte=rank, rank_end__gte=rank
        )
        .select_related("node")
        .first()
    )
    if allocation is None:
        return None
    report = {"source": "simulator", "kind": strike.kind, "node": allocation.node}
    if strike.kind == "gpu_xid":
        report |= {"xid": strike.xid or 79, "gpu_index": rank % 8}
    elif strike.kind in ("ecc_uncorrectable", "nvlink_error", "thermal"):
        report |= {"gpu_index": rank % 8}
    elif strike.kind in ("nic_down", "link_flap", "link_degraded"):
        report |= {"nic_name": f"mlx5_{rank % 8}"}
    return report


def recover(clock, cluster, since: datetime) -> tuple[int, str]:
    """Beat's recovery step, each time with the clock moved to the next moment something is due (a running step's
    end or deadline, a waiting one's retry), until nothing is planned or running. Returns the steps taken and how it
    ended: "ended", "waiting" (nothing will ever be due: it waits for what the replay does not model) or "unended"."""
    from jobs.models import RecoveryAction
    from jobs.services.advance import recovery_advance

    pending = RecoveryAction.objects.filter(cluster=cluster, state__in=("planned", "running"))
    for step in range(50):
        if not pending.exists():
            return step, "ended"
        times = [t for row in pending.values_list("done_at", "deadline_at", "retry_at") for t in row if t]
        if not times:
            return step, "waiting"
        clock.move_to(max(min(times), since) + timedelta(seconds=1))
        recovery_advance(cluster_ids=[cluster.pk])
    return 50, "unended"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default="llama3")
    parser.add_argument("--spare-fraction", type=float, default=0.02)
    parser.add_argument("--limit", type=int, default=0, help="stop after this many interruptions (0: all)")
    args = parser.parse_args()
    setup_django(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))

    import time_machine
    from django.core.management import call_command

    from jobs.models import RecoveryAction
    from jobs.services.faults import fault_ingest
    from simulator.profiles import PROFILES
    from simulator.sampling import FaultSampler

    began = time.perf_counter()
    with time_machine.travel(START, tick=False) as clock:
        call_command("migrate", verbosity=0)
        migrated = time.perf_counter()
        cluster, job = build(args.gpus, args.spare_fraction)
        built = time.perf_counter()
        strikes = FaultSampler(PROFILES[args.profile], args.gpus, args.seed).until(args.days * 24)
        if args.limit:
            strikes = strikes[: args.limit]
        phases = {"intake and decision": [], "recovery steps": []}
        kinds, steps, outcomes, missing = Counter(), [], Counter(), 0
        for strike in strikes:
            clock.move_to(START + timedelta(hours=strike.at_hours))
            report = fault_of(strike, job)
            if report is None:  # the job holds no nodes now (it failed, or waits for them)
                missing += 1
                continue
            t0 = time.perf_counter()
            fault, _ = fault_ingest(**report)
            t1 = time.perf_counter()
            count, outcome = recover(clock, cluster, START + timedelta(hours=strike.at_hours))
            outcomes[outcome] += 1
            t2 = time.perf_counter()
            phases["intake and decision"].append(t1 - t0)
            phases["recovery steps"].append(t2 - t1)
            steps.append(count)
            kinds.update(RecoveryAction.objects.filter(fault=fault).values_list("kind", flat=True))
    done = time.perf_counter()
    n = len(steps)
    print(
        f"{args.gpus} GPUs ({args.gpus // 8} nodes + spares), {args.days:g} days, seed {args.seed}: "
        f"{len(strikes)} interruptions sampled, {n} replayed"
    )
    print(
        f"schema {migrated - began:.1f} s, world {built - migrated:.1f} s, replay {done - built:.1f} s: "
        f"{1000 * (done - built) / max(1, n):.0f} ms per interruption"
    )
    for name, times in phases.items():
        if times:
            print(
                f"  {name}: median {1000 * statistics.median(times):.0f} ms, "
                f"mean {1000 * statistics.mean(times):.0f} ms, max {1000 * max(times):.0f} ms"
            )
    job.refresh_from_db()
    print(
        f"  beat steps per recovery: median {statistics.median(steps) if steps else 0}; recoveries "
        f"{dict(outcomes)}; strikes while the job held no nodes: {missing}; the job ends {job.state}"
    )
    print(f"  actions: {dict(kinds.most_common())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
