"""Node page speed: server time to render a node's telemetry page at 32 GPUs × 24 h of samples.

    .venv/bin/python bench/node_page.py [--gpus 32] [--hours 24] [--neighbours 3] [--renders 15] [--reuse]

Builds a scratch PostgreSQL database (lockstep_bench_node_page) with one node of ``--gpus`` GPUs and 8 NICs and
``--neighbours`` nodes of 8 GPUs beside it, ingests ``--hours`` of readings for all of them at the agent's
interval (AGENT_INTERVAL_SECONDS, the agent's --interval default: 10 s) through the real ingest service
(telemetry_ingest: raw GPU and NIC samples, per-minute history, latest state), adds 20 faults with a recovery each on the
node, then renders its page as an operator through Django's test client (server time only: no network, no
browser) for each range (per-GPU series with memory, per-NIC series), and prints the median and p95 render time,
the SQL query count and the page's size.
Target: under 300 ms at 24 h.
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import django  # noqa: E402
from scratch import PG, scratch_database  # noqa: E402

DB_NAME = "lockstep_bench_node_page"


def build(gpus: int, neighbours: int):
    from fleet.models import GPU, NIC, Cluster, Fleet, Node

    cluster = Cluster.objects.create(fleet=Fleet.objects.create(name="bench"), name="bench-node-page")
    sizes = {"big-0": gpus, **{f"n-{i:03d}": 8 for i in range(neighbours)}}
    nodes = Node.objects.bulk_create(
        [Node(cluster=cluster, hostname=name, gpu_model="GB200") for name in sizes]
    )
    GPU.objects.bulk_create(
        [
            GPU(node=node, index=g, uuid=f"GPU-{node.hostname}-{g}", model="GB200")
            for node in nodes
            for g in range(sizes[node.hostname])
        ]
    )
    NIC.objects.bulk_create([NIC(node=node, name=f"mlx5_{r}", rail=r) for node in nodes for r in range(8)])
    return cluster, nodes, sizes


def nic(node: str, rail: int, ts: float, step: int) -> dict:
    fields = {"rx_bytes": step * 10**10, "tx_bytes": step * 10**10, "rx_errors": 0, "carrier_changes": 2}
    return {
        "ts": ts,
        "node": node,
        "name": f"mlx5_{rail}",
        "kind": "ethernet",
        "link_state": "up",
        "fields": fields,
    }


def ingest(cluster, sizes: dict, hours: float, every: float) -> int:
    """``hours`` of readings every ``every`` seconds for every GPU and NIC, ten minutes to a batch, as a relay
    agent would send them; returns the readings ingested."""
    from ingest_throughput import reading  # the agent's full set of DCGM fields

    from telemetry.services.ingest import telemetry_ingest

    steps = int(hours * 3600 / every)
    end = time.time() - 5
    chunk = int(600 / every)
    for first in range(0, steps, chunk):
        span = range(first, min(steps, first + chunk))
        stamps = [(end - (steps - 1 - step) * every, step) for step in span]
        body = {
            "schema_version": 1,
            "batch_id": str(uuid.uuid4()),
            "agent": {"name": "bench", "version": "1", "hostname": "relay", "gpu_status": "ok"},
            "created_at": time.time(),
            "sent_at": time.time(),
            "node": None,
            "readings": [
                reading(g, name, ts, step)
                for ts, step in stamps
                for name, n in sizes.items()
                for g in range(n)
            ],
            "nics": [nic(name, r, ts, step) for ts, step in stamps for name in sizes for r in range(8)],
            "events": [],
            "facility": [],
        }
        telemetry_ingest(cluster=cluster, body=json.dumps(body).encode())
    return steps * sum(sizes.values())


def faults(node, count: int = 20) -> None:
    """Faults spread over the day, each with a recovery action (written straight: the planner is not benched)."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import FaultEvent, RecoveryAction

    now = timezone.now()
    for i in range(count):
        at = now - timedelta(hours=23 * i / count)
        fault = FaultEvent.objects.create(
            kind="gpu_xid",
            xid=79,
            gpu_index=i % 32,
            cluster=node.cluster,
            node=node,
            sources=["agent"],
            detected_at=at,
            received_at=at,
            correlation_key=f"bench-{i}",
        )
        RecoveryAction.objects.create(
            fault=fault,
            cluster=node.cluster,
            node=node,
            kind="gpu_reset",
            state="succeeded",
            planned_at=at,
            detected_at=at,
        )


def measure(client, url: str, renders: int) -> tuple[list[float], int, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    return sorted(times), len(queries.captured_queries), len(response.content)


def seed(args) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.access import Role
    from tenancy.models import Membership

    every = settings.AGENT_INTERVAL_SECONDS
    cluster, nodes, sizes = build(args.gpus, args.neighbours)
    started = time.perf_counter()
    readings = ingest(cluster, sizes, args.hours, every)
    print(
        f"ingested {readings:,} GPU readings ({args.hours:g} h every {every:g} s, {sum(sizes.values())} GPUs) "
        f"through telemetry_ingest in {time.perf_counter() - started:.0f} s"
    )
    faults(nodes[0])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    user = get_user_model().objects.create_user("bench-operator", password="x")
    Membership.objects.create(user=user, role=Role.OPERATOR)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--renders", type=int, default=15)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure the database a previous run built (its samples age with it)",
    )
    args = parser.parse_args()
    if args.reuse:
        os.environ.update(
            DATABASE_URL=f"{PG}/{DB_NAME}",
            ALLOWED_HOSTS="testserver",
            DJANGO_SETTINGS_MODULE=os.environ.get("DJANGO_SETTINGS_MODULE", "controlplane.testing.settings"),
        )
        django.setup()
    else:
        scratch_database(DB_NAME, ALLOWED_HOSTS="testserver")
    from django.contrib.auth import get_user_model
    from django.test import Client

    from fleet.models import Node
    from telemetry.models import GPUSample, NICSample

    if not args.reuse:
        seed(args)
    client = Client()
    client.force_login(get_user_model().objects.get(username="bench-operator"))
    node = Node.objects.get(hostname="big-0")
    samples = GPUSample.objects.filter(gpu_id__in=node.gpus.values("id")).count()
    nic_samples = NICSample.objects.filter(nic_id__in=node.nics.values("id")).count()
    print(
        f"node {node.hostname}: {node.gpus.count()} GPUs, {samples:,} GPU samples, {node.nics.count()} NICs, "
        f"{nic_samples:,} NIC samples; load {os.getloadavg()[0]:.1f}"
    )
    for key in ("1h", "6h", "24h", "7d"):
        times, queries, size = measure(client, f"/nodes/{node.pk}/?range={key}", args.renders)
        median = statistics.median(times)
        p95 = times[max(0, int(len(times) * 0.95) - 1)]
        print(
            f"  range {key:>3}: median {median:.0f} ms, p95 {p95:.0f} ms over {args.renders} renders, "
            f"{queries} SQL queries, {size / 1024:.0f} KiB page"
            + (" (target 300 ms)" if key == "24h" else "")
        )
    print(f"load average (1 min) after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
