"""Benchmark (not a timed test): from an Xid on a GPU to Lockstep's decision through Prometheus and Alertmanager.

A real Prometheus and Alertmanager (Debian's packages, tests/support/monitoring.py) run the shipped
configuration (deploy/), a real Lockstep (uvicorn and one Celery worker) takes the webhook. Each node's exporter is
the agent's dcgm-exporter-named /metrics (lockstep_agent.metrics) over the fake NVML, in this process, so the Xid is
raised at a known instant; the agent does not report it itself, so the alert is the only path. Each run raises
Xid 79 on GPU 0 of another node, under a job of its own, and reads:

- Xid -> alert active: Prometheus's next scrape of the node plus its next rule evaluation (the alert's activeAt);
- alert -> webhook: Prometheus sending it to Alertmanager, group_wait, and the POST (the fault's received_at);
- webhook -> decision: the fault handled by the worker (its recovery action's planned_at).

Run: .venv/bin/python bench/alert_path.py [--runs 5] [--timings shipped|test|both]
"shipped" uses the intervals of the files in deploy/ (GPU nodes scraped every 10 s, rules every 10 s, group_wait
10 s); "test" those of tests/monitoring (1 s, 1 s, 1 s). Needs prometheus and prometheus-alertmanager, a
PostgreSQL at BENCH_ADMIN_DATABASE_URL (scratch database lockstep_bench_alerts, dropped after) and Redis at
BENCH_REDIS_URL.
"""

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "agent"))

DB_NAME = "lockstep_bench_alerts"
ADMIN_URL = os.environ.get("BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DB_URL = ADMIN_URL.rsplit("/", 1)[0] + f"/{DB_NAME}"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
FAKE_NVML = ROOT / "tests" / "agent" / "fakenvml" / "pynvml.py"


def scratch_database(drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


def setup_django() -> None:
    os.environ.update(
        DATABASE_URL=DB_URL,
        REDIS_URL=REDIS_URL,
        DJANGO_SETTINGS_MODULE="controlplane.testing.settings",
        LOG_LEVEL="WARNING",
    )
    import django

    django.setup()
    import redis
    from django.core.management import call_command

    redis.Redis.from_url(REDIS_URL).flushdb()
    call_command("migrate", verbosity=0)


def fake_nvml():
    """A fresh fake pynvml module (tests/agent/fakenvml): one per node, each with its own GPUs and events."""
    spec = importlib.util.spec_from_file_location(f"pynvml_{time.monotonic_ns()}", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.configure()
    return module


def build_world(nodes: int, label: str):
    """A provider user's read and write tokens, and a protected simulated cluster of ``nodes`` nodes, each under
    an 8-GPU job of its own, with as many spares."""
    import uuid

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fleet.choices import HealthStatus, NodeState, SyncStatus
    from fleet.models import GPU, NIC, Blueprint, BlueprintVersion, Cluster, Fleet, Node, ObservedAddon
    from jobs.models import Job, JobAllocation
    from tenancy.models import Membership, Tenant
    from tenancy.services import token_create

    user = get_user_model().objects.create_user(f"bench-{label}", password="x" * 20)
    Membership.objects.create(user=user, role="operator")
    _, read = token_create(actor=user, owner=user, name="prometheus", scope="read")
    _, write = token_create(actor=user, owner=user, name="alertmanager", scope="write")
    tenant = Tenant.objects.create(name=f"Bench {label}", slug=f"bench-{label}")
    blueprint = Blueprint.objects.create(name=f"bench-{label}", auto_rollout=False)
    version = BlueprintVersion.objects.create(
        blueprint=blueprint,
        number=1,
        state="active",
        policy={"protection": {"nic_failover": True, "live_migration": True}},
    )
    fleet = Fleet.objects.create(name=f"bench-{label}")
    cluster = Cluster.objects.create(
        fleet=fleet,
        name=f"bench-alerts-{label}",
        blueprint=blueprint,
        blueprint_version=version,
        connection={"migration_pause_seconds": 1},
    )
    now = timezone.now()
    for name in ("nic-failover", "live-migration"):
        ObservedAddon.objects.create(
            cluster=cluster, name=name, sync=SyncStatus.IN_SYNC, health=HealthStatus.HEALTHY, observed_at=now
        )
    working = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"{label}-gpu-{i:03d}",
                gpu_model="H100",
                leaf_switch="leaf-0",
                rack="rack-0",
                state=NodeState.READY,
            )
            for i in range(nodes)
        ]
    )
    spares = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"{label}-spare-{i:03d}",
                gpu_model="H100",
                leaf_switch="leaf-0",
                rack="rack-0",
                state=NodeState.SPARE,
            )
            for i in range(nodes)
        ]
    )
    GPU.objects.bulk_create(
        [
            GPU(node=n, index=i, uuid=f"GPU-{uuid.uuid4()}", model="H100")
            for n in working + spares
            for i in range(8)
        ]
    )
    NIC.objects.bulk_create(
        [NIC(node=n, name=f"mlx5_{i}", rail=i) for n in working + spares for i in range(8)]
    )
    jobs = Job.objects.bulk_create(
        [
            Job(
                tenant=tenant,
                cluster=cluster,
                name=f"job-{label}-{i}",
                gpus=8,
                state="Running",
                checkpoint_interval=10**9,
                iteration_at=now,
                started_at=now,
            )
            for i in range(nodes)
        ]
    )
    JobAllocation.objects.bulk_create(
        [
            JobAllocation(job=j, node=n, gpu_indices=list(range(8)), rank_start=0, rank_end=7)
            for j, n in zip(jobs, working, strict=True)
        ]
    )
    return read, write, working


class Exporter:
    """One node's agent /metrics over its own fake NVML, served from this process."""

    def __init__(self, hostname: str):
        from lockstep_agent.gpu import GPUCollector
        from lockstep_agent.metrics import DCGMCollector, serve

        from tests.support.processes import free_port

        self.nvml = fake_nvml()
        self.gpus = GPUCollector(nvml=self.nvml)
        self.gpus.open()
        self.collector = DCGMCollector(hostname=hostname, gpus=self.gpus)
        self.collector.update(self.gpus.collect())
        self.port = free_port()
        self.server, _ = serve(self.collector, port=self.port, address="127.0.0.1")

    def raise_xid(self, xid: int) -> float:
        self.nvml.inject_xid(0, xid)
        at = time.time()
        self.gpus.wait_for_events(0)  # NVML hands the event over; the agent's loop blocks on it
        return at

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.gpus.close()


def _epoch(value) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.timestamp()


def one_run(stack, exporter: Exporter, node) -> dict:
    from jobs.models import FaultEvent, RecoveryAction
    from tests.support.processes import wait_for

    xid_at = exporter.raise_xid(79)
    fault = wait_for(
        lambda: FaultEvent.objects.filter(node=node, kind="gpu_xid").first(),
        120,
        0.05,
        what=f"the alert for {node.hostname}",
    )
    action = wait_for(
        lambda: RecoveryAction.objects.filter(fault=fault).order_by("planned_at").first(),
        60,
        0.05,
        what="the decision",
    )
    active = [a for a in stack.alerts() if a["labels"].get("Hostname") == node.hostname]
    active_at = _epoch(active[0]["activeAt"]) if active else float("nan")
    received, planned = _epoch(fault.received_at), _epoch(action.planned_at)
    return {
        "xid_to_active": active_at - xid_at,
        "active_to_webhook": received - active_at,
        "webhook_to_decision": planned - received,
        "xid_to_decision": planned - xid_at,
        "kind": action.kind,
    }


def run_timings(label: str, timings, runs: int, folder: Path) -> list[dict]:
    from tests.support.monitoring import MonitoringStack
    from tests.support.processes import celery_worker, uvicorn_server, wait_for

    folder.mkdir(parents=True, exist_ok=True)
    read, write, nodes = build_world(runs, label)
    exporters = [Exporter(node.hostname) for node in nodes]
    results = []
    try:
        with (
            uvicorn_server(folder) as server,
            celery_worker(folder, concurrency=1),
            MonitoringStack(
                folder / f"monitoring-{label}",
                lockstep_url=server.url,
                scrape_token=read,
                webhook_token=write,
                timings=timings,
                gpu_targets=[
                    (f"127.0.0.1:{e.port}", n.hostname) for e, n in zip(exporters, nodes, strict=True)
                ],
            ) as stack,
        ):
            wait_for(
                lambda: (
                    all(t["health"] == "up" for t in stack.targets())
                    and sum(t["labels"]["job"] == "gpu-nodes" for t in stack.targets()) == runs
                ),
                60,
                0.5,
                what="every target scraped",
            )
            for index, (exporter, node) in enumerate(zip(exporters, nodes, strict=True)):
                # Xids land at a random phase of the scrape and evaluation cycles, as they would.
                time.sleep((index * 0.37) % 1 * _interval(timings.scrape_interval))
                result = one_run(stack, exporter, node)
                results.append(result)
                print(
                    f"  {label} run {index + 1}: Xid -> active {result['xid_to_active']:5.2f} s, -> webhook "
                    f"{result['active_to_webhook']:5.2f} s, -> decision {result['webhook_to_decision'] * 1000:5.0f} ms;"
                    f" Xid -> decision {result['xid_to_decision']:5.2f} s ({result['kind']})",
                    flush=True,
                )
    finally:
        for exporter in exporters:
            exporter.close()
    return results


def _interval(duration: str) -> float:
    from tests.support.monitoring import _seconds

    return _seconds(duration)


def summary(label: str, timings, results: list[dict]) -> None:
    def stats(key: str) -> str:
        values = sorted(r[key] for r in results)
        return f"median {statistics.median(values):.2f} s, min {values[0]:.2f}, max {values[-1]:.2f}"

    print(
        f"{label}: scrape {timings.scrape_interval}, evaluation {timings.evaluation_interval}, group_wait "
        f"{timings.group_wait} ({len(results)} runs)"
    )
    for key in ("xid_to_active", "active_to_webhook", "webhook_to_decision", "xid_to_decision"):
        print(f"  {key.replace('_', ' '):22s} {stats(key)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timings", choices=("shipped", "test", "both"), default="both")
    args = parser.parse_args()
    scratch_database()
    setup_django()
    from tests.support.monitoring import Timings, available

    why = available()
    if why:
        print(why, file=sys.stderr)
        scratch_database(drop_only=True)
        return 2

    chosen = {"shipped": Timings.shipped(), "test": Timings()}
    labels = ["shipped", "test"] if args.timings == "both" else [args.timings]
    folder = Path(tempfile.mkdtemp(prefix="lockstep-bench-alerts-"))
    measured = {}
    try:
        for label in labels:
            measured[label] = run_timings(label, chosen[label], args.runs, folder / label)
    finally:
        from django.db import connections

        connections.close_all()
        scratch_database(drop_only=True)
    for label in labels:
        summary(label, chosen[label], measured[label])
    return 0


if __name__ == "__main__":
    sys.exit(main())
