"""Issue 20's measurement: a what-if's sampled interruptions through the product's own services, on a virtual clock.

    .venv/bin/python bench/whatif_real_path.py                       # 16,384 GPUs, 54 days (about 420 strikes)
    .venv/bin/python bench/whatif_real_path.py --gpus 2048 --days 7 --limit 40

Not yet the what-if (``manage.py simulate what-if`` still replays through the planner's pure functions): this is the
loop the real-path replay would run, timed (docs/benchmarks.md, "What-if replay"). It builds one protected cluster
(the job's nodes and 2 % spares) and one job on all of them in a scratch store: an embedded in-memory SQLite database
that the run creates and throws away, so the live fleet's rows cannot be reached from it. It samples the
interruptions the what-if samples (``FaultSampler``, same profile and seed). For each one in turn it moves the clock
to it (``time-machine``: every ``timezone.now()`` of the product reads it) and reports it through fault intake
(``fault_ingest``; the decision runs in-process, Celery eager). Then it moves the clock to each due recovery step and
runs beat's recovery step (``recovery_advance``) until the recovery has ended.

Between strikes it plays the two parts the product leaves to the world. A node whose ladder waits for a repair is
repaired after an exponential time of mean ``--repair-hours`` (the what-if's assumption), through
``escalation_repaired``; the ladder then checks it and returns it to the spare pool. A downed NIC comes back after
the planner's own 30-minute assumption, and beat's failback ends the degraded stretch. It prints the time per
interruption, split by phase, the recovery kinds chosen, and what the product recorded: the job's phases and the
ledger's GPU-hours.

What it leaves out, which the what-if needs on top: predictions from the precursors, failed recoveries and
correlated (rack, leaf) failures, lemon nodes, checkpoint-write stalls, the unprotected baseline and the sensitivity
table. Redis (``BENCH_REDIS_URL``, default DB 9) carries the decision's marks and events.
"""

import argparse
import heapq
import math
import os
import random
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


def ledger(job, start: datetime, end: datetime) -> str:
    """What the product recorded for the job: its phases' time out of running, and the ledger's GPU-hours."""
    from django.db.models import Sum

    from jobs.models import JobPhase, RecoveryAction

    out = {}
    for kind, began, ended in JobPhase.objects.filter(job=job).values_list("kind", "started_at", "ended_at"):
        began, ended = max(began, start), min(ended or end, end)
        if ended > began:
            out[kind] = out.get(kind, 0.0) + (ended - began).total_seconds() / 3600
    sums = RecoveryAction.objects.filter(job=job).aggregate(
        lost=Sum("gpu_hours_lost"), baseline=Sum("gpu_hours_baseline"), work=Sum("work_lost_seconds")
    )
    hours = (end - start).total_seconds() / 3600
    return (
        f"  the job's phases (hours of {hours:.0f}): {', '.join(f'{k} {v:.1f}' for k, v in sorted(out.items()))}; "
        f"ledger: {sums['lost'] or 0:.0f} GPU-h lost against a restart baseline of {sums['baseline'] or 0:.0f}, "
        f"work redone {(sums['work'] or 0) / 3600:.1f} h"
    )


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


class Links:
    """A downed link comes back after the planner's own assumption (``Estimates.nic_degraded_seconds``, the same the
    formula replay books): the replay marks the NIC up through the fleet's service, and beat's failback
    (``links_fail_back``) returns the job to full speed once the link has been clean for LINK_CLEAN_SECONDS."""

    def __init__(self, cluster):
        from django.conf import settings

        from jobs.planner import Estimates

        self.cluster, self.down = cluster, timedelta(seconds=Estimates().nic_degraded_seconds)
        self.clean = timedelta(seconds=settings.LINK_CLEAN_SECONDS)
        self.due: list[tuple[datetime, int, int, str]] = []  # (when, order, node, NIC); 0: up, 1: fail back
        self.failed_back = 0

    def schedule(self, at: datetime, report: dict) -> None:
        if report.get("nic_name"):
            heapq.heappush(self.due, (at + self.down, 0, report["node"].pk, report["nic_name"]))

    def run_until(self, clock, until: datetime) -> None:
        from fleet.services.hardware import nic_links_set
        from jobs.services.links import links_fail_back

        while self.due and self.due[0][0] <= until:
            at, order, node_id, nic = heapq.heappop(self.due)
            clock.move_to(at)
            if order == 0:
                nic_links_set(links=[(node_id, nic)], state="up")
                heapq.heappush(self.due, (at + self.clean + timedelta(seconds=1), 1, node_id, nic))
            else:
                self.failed_back += links_fail_back()
                recover(clock, self.cluster, at)


class Repairs:
    """The replay's operator: a node whose ladder waits for a repair is repaired after a time drawn from an
    exponential of mean ``hours`` (the what-if's repair-time assumption), through the product's own
    ``escalation_repaired``; the ladder then runs its health check and returns the node to the spare pool."""

    def __init__(self, cluster, hours: float, seed: int):
        self.cluster, self.hours, self.random = cluster, hours, random.Random(f"repairs-{seed}")
        self.due: list[tuple[datetime, int]] = []
        self.waiting: set[int] = set()
        self.done = 0

    def schedule(self, now: datetime) -> None:
        from jobs.models import NodeEscalation

        failed = NodeEscalation.objects.filter(node__cluster=self.cluster, stage="failed").values_list(
            "node_id", flat=True
        )
        for node_id in set(failed) - self.waiting:
            self.waiting.add(node_id)
            hours = -math.log(1.0 - self.random.random()) * self.hours
            heapq.heappush(self.due, (now + timedelta(hours=hours), node_id))

    def run_until(self, clock, until: datetime) -> None:
        from django.db import transaction

        from fleet.models import Node
        from jobs.services.escalation import escalation_repaired

        while self.due and self.due[0][0] <= until:
            at, node_id = heapq.heappop(self.due)
            self.waiting.discard(node_id)
            clock.move_to(at)
            with transaction.atomic():
                escalation_repaired(actor=None, node=Node.objects.get(pk=node_id), reason="replayed repair")
            recover(clock, self.cluster, at)
            self.done += 1
            self.schedule(at)


def run_until(clock, until: datetime, repairs: "Repairs", links: "Links") -> None:
    """Every repair and link event due before ``until``, in time order."""
    while True:
        nexts = [queue.due[0][0] for queue in (repairs, links) if queue.due and queue.due[0][0] <= until]
        if not nexts:
            return
        first = min(nexts)
        for queue in (repairs, links):
            queue.run_until(clock, first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=16_384)
    parser.add_argument("--days", type=float, default=54.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", default="llama3")
    parser.add_argument("--spare-fraction", type=float, default=0.02)
    parser.add_argument("--repair-hours", type=float, default=24.0, help="mean repair time (exponential)")
    parser.add_argument("--limit", type=int, default=0, help="stop after this many interruptions (0: all)")
    args = parser.parse_args()
    setup_django(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9"))

    import time_machine
    from django.core.management import call_command
    from django.utils import timezone

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
        repairs, links = Repairs(cluster, args.repair_hours, args.seed), Links(cluster)
        for strike in strikes:
            at = START + timedelta(hours=strike.at_hours)
            run_until(clock, at, repairs, links)
            clock.move_to(at)
            report = fault_of(strike, job)
            if report is None:  # the job holds no nodes now (it failed, or waits for them)
                missing += 1
                continue
            t0 = time.perf_counter()
            fault, _ = fault_ingest(**report)
            links.schedule(at, report)
            t1 = time.perf_counter()
            count, outcome = recover(clock, cluster, START + timedelta(hours=strike.at_hours))
            outcomes[outcome] += 1
            repairs.schedule(timezone.now())
            t2 = time.perf_counter()
            phases["intake and decision"].append(t1 - t0)
            phases["recovery steps"].append(t2 - t1)
            steps.append(count)
            kinds.update(RecoveryAction.objects.filter(fault=fault).values_list("kind", flat=True))
        run_until(clock, START + timedelta(days=args.days), repairs, links)
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
        f"{dict(outcomes)}; strikes while the job held no nodes: {missing}; the job ends {job.state.lower()}"
    )
    print(
        f"  actions: {dict(kinds.most_common())}; nodes repaired and back: {repairs.done}; links failed back: {links.failed_back}"
    )
    print(ledger(job, START, START + timedelta(days=args.days)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
