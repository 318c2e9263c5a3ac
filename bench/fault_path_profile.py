"""Where the fault path's CPU goes, in-process: the intake (POST /api/v1/faults/ through Django's handler and every
middleware) and the decision (``fault_handle`` for a cluster's new faults), each as CPU milliseconds per fault in
this process and in its PostgreSQL backend, and statements per fault.

It builds the latency benchmark's world (bench/fault_latency.py: 4 protected clusters of 256 nodes) in a scratch
database, POSTs ``--faults`` NIC faults with the queueing of their handling held back, then decides them in batches
of ``--batch`` faults per cluster. Last, ``--batches`` agent batches (a node's remaining NICs down in one report, a
storm's intake) go through ``fault_ingest_many``. Figures are CPU time (``time.process_time``, and the backend's
utime + stime from /proc), so other work on the machine moves them less than it moves wall-clock times. ``--profile web`` or
``--profile worker`` prints cProfile's top functions of that part. Run:

    .venv/bin/python bench/fault_path_profile.py                     # 400 POSTs, decisions of 5 faults
    .venv/bin/python bench/fault_path_profile.py --batch 20 --profile worker
"""

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DB_NAME = os.environ.get("BENCH_DATABASE_NAME", "lockstep_bench_profile")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")


def backend_cpu() -> float:
    """CPU seconds this process's PostgreSQL backend has used."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Counted:
    """CPU here, CPU in the backend, and statements, over the blocks it is entered for (they add up)."""

    def __init__(self, profile: bool):
        self.profiler = cProfile.Profile(time.process_time) if profile else None
        self.statements = 0
        self.cpu = self.backend = 0.0

    def _count(self, execute, sql, params, many, context):
        self.statements += 1
        return execute(sql, params, many, context)

    def __enter__(self):
        from django.db import connection

        self._backend = backend_cpu()
        self._wrapper = connection.execute_wrapper(self._count)
        self._wrapper.__enter__()
        self._cpu = time.process_time()
        if self.profiler:
            self.profiler.enable()
        return self

    def __exit__(self, *exc):
        if self.profiler:
            self.profiler.disable()
        self.cpu += time.process_time() - self._cpu
        self._wrapper.__exit__(*exc)
        self.backend += backend_cpu() - self._backend
        return False

    def line(self, what: str, n: int) -> str:
        return (
            f"{what}: {1000 * self.cpu / n:.2f} ms CPU per fault here, {1000 * self.backend / n:.2f} ms in "
            f"PostgreSQL, {self.statements / n:.1f} statements per fault ({n} faults)"
        )

    def top(self, n: int = 60) -> None:
        if self.profiler and os.environ.get("BENCH_PROFILE_DUMP"):
            self.profiler.dump_stats(os.environ["BENCH_PROFILE_DUMP"])
        if self.profiler:
            pstats.Stats(self.profiler).sort_stats("cumulative").print_stats(n)


def completions(RecoveryAction, args) -> None:
    """The recoveries' ends: beat's recovery_advance completing the decided NIC failovers (their simulated
    operations set done), as it does every second, per action."""
    from django.utils import timezone

    from fleet.models import SimulatedOperation
    from jobs.services.advance import recovery_advance

    SimulatedOperation.objects.update(done_at=timezone.now() - timezone.timedelta(seconds=1))
    running = RecoveryAction.objects.filter(state="running").count()
    RecoveryAction.objects.filter(state="running").update(
        done_at=timezone.now() - timezone.timedelta(seconds=1)
    )
    counted = Counted(args.profile == "completions")
    with counted:
        while recovery_advance()["completed"]:
            pass
    print(counted.line("completions (recovery_advance, in-process)", max(running, 1)))
    print(
        f"  {RecoveryAction.objects.filter(state='succeeded').count()} of {running} running actions completed"
    )
    counted.top()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", type=int, default=400)
    parser.add_argument("--batch", type=int, default=5, help="faults of a cluster per decision")
    parser.add_argument("--batches", type=int, default=40, help="agent batches (a node's NICs down together)")
    parser.add_argument("--profile", choices=["web", "worker", "completions"], default=None)
    parser.add_argument(
        "--statements", action="store_true", help="print the statements of one POST and one decision"
    )
    args = parser.parse_args()

    from scratch import scratch_database

    scratch_database(DB_NAME, REDIS_URL=REDIS_URL, LOG_LEVEL="WARNING")
    from django.conf import settings
    from django.db.models import Count
    from django.test import Client
    from fault_latency import build_world

    import jobs.services.faults as faults_module
    from jobs.models import FaultEvent

    settings.ALLOWED_HOSTS = ["*"]
    token, targets = build_world()
    faults_module._enqueue = lambda *a, **k: None  # decisions are timed below, by batch
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    for node, nic in targets[-20:]:  # warm: imports, URL resolution, the pool
        client.post(
            "/api/v1/faults/", {"node": node, "kind": "nic_down", "nic_name": nic}, "application/json"
        )
    del targets[-20:]
    FaultEvent.objects.update(state="handled")
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if args.statements:
        node, nic = targets.pop()
        with CaptureQueriesContext(connection) as captured:
            client.post(
                "/api/v1/faults/", {"node": node, "kind": "nic_down", "nic_name": nic}, "application/json"
            )
        for query in captured.captured_queries:
            print("  POST:", query["sql"][:300])
    with Counted(args.profile == "web") as web:
        for _ in range(args.faults):
            node, nic = targets.pop()
            response = client.post(
                "/api/v1/faults/",
                {"node": node, "kind": "nic_down", "nic_name": nic, "source": "agent"},
                "application/json",
            )
            assert response.status_code == 201, response.content
    print(web.line("intake (POST /api/v1/faults/, in-process)", args.faults))
    web.top()

    decided = 0
    clusters = sorted(set(FaultEvent.objects.filter(state="new").values_list("cluster_id", flat=True)))
    per_cluster = {
        c: list(FaultEvent.objects.filter(state="new", cluster_id=c).order_by("pk")) for c in clusters
    }
    FaultEvent.objects.filter(state="new").update(state="held")
    worker = Counted(args.profile == "worker")
    while any(per_cluster.values()):
        for cluster_id, waiting in per_cluster.items():
            batch, per_cluster[cluster_id] = waiting[: args.batch], waiting[args.batch :]
            if not batch:
                continue
            FaultEvent.objects.filter(pk__in=[f.pk for f in batch]).update(state="new")
            with worker:
                if args.statements and not decided:
                    with CaptureQueriesContext(connection) as captured:
                        faults_module.fault_handle(fault_id=batch[0].pk, cluster_id=cluster_id)
                    for query in captured.captured_queries:
                        print("  decision:", query["sql"][:250])
                else:
                    faults_module.fault_handle(fault_id=batch[0].pk, cluster_id=cluster_id)
            decided += len(batch)
    from jobs.models import RecoveryAction

    print(worker.line(f"decisions of {args.batch} faults (fault_handle, in-process)", decided))
    print(
        f"  {RecoveryAction.objects.count()} recovery actions; faults by state:",
        dict(FaultEvent.objects.values_list("state").annotate(n=Count("id")).order_by()),
    )
    worker.top()
    completions(RecoveryAction, args)
    agent_batches(targets, args)


def agent_batches(targets, args) -> None:
    """A storm's intake: agent batches through ``fault_ingest_many``, each a node's remaining NICs down at once."""
    from fleet.models import Node
    from jobs.services.faults import FaultReport, fault_ingest_many

    by_node: dict[int, list[str]] = {}
    for node_id, nic in targets:
        by_node.setdefault(node_id, []).append(nic)
    chosen = list(by_node.items())[: args.batches]
    nodes = Node.objects.select_related("cluster").in_bulk([node_id for node_id, _ in chosen])
    counted, reports = Counted(False), 0
    with counted:
        for node_id, nics in chosen:
            batch = [FaultReport(kind="nic_down", node=nodes[node_id], nic_name=nic) for nic in nics]
            fault_ingest_many(source="agent", reports=batch)
            reports += len(batch)
    print(
        counted.line(
            f"agent batches of {reports / max(len(chosen), 1):.0f} NICs (fault_ingest_many, in-process)",
            reports,
        )
    )


if __name__ == "__main__":
    main()
