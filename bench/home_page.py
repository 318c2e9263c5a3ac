"""Provider home page speed: server time to render the fleet dashboard with 4,000 nodes and 32,000 GPUs.

    .venv/bin/python bench/home_page.py [--nodes 4000] [--renders 20]

Builds a scratch PostgreSQL database (lockstep_bench_home) with ``--nodes`` nodes of 8 GPUs over 10 clusters,
some unhealthy GPUs and failed nodes, renders "/" as a provider-admin through Django's test client (server
time only: no network, no browser), and prints the median and p95 render time and the SQL query count,
beside the count for a fleet a tenth of the size (it must not grow with the fleet). Target: under 150 ms.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_database  # noqa: E402

DB_NAME = "lockstep_bench_home"


def build(nodes: int, start: int = 0) -> None:
    from fleet.models import GPU, NIC, Cluster, Fleet, Node

    fleet, _ = Fleet.objects.get_or_create(name="bench")
    per_cluster = nodes // 10
    for c in range(10):
        cluster, _ = Cluster.objects.get_or_create(fleet=fleet, name=f"bench-{c}")
        Node.objects.bulk_create(
            [
                Node(
                    cluster=cluster,
                    hostname=f"c{c}-n{i:05d}",
                    gpu_model="H100",
                    rack=f"r{i // 8}",
                    leaf_switch=f"l{i // 16}",
                    state="failed" if i % 97 == 0 else "ready",
                )
                for i in range(start, start + per_cluster)
            ],
            batch_size=5000,
        )
    ids = list(Node.objects.filter(gpus__isnull=True).values_list("id", flat=True))
    GPU.objects.bulk_create(
        [
            GPU(
                node_id=n,
                index=g,
                uuid=f"GPU-{n}-{g}",
                model="H100",
                health="failed" if (n * 8 + g) % 211 == 0 else "healthy",
            )
            for n in ids
            for g in range(8)
        ],
        batch_size=10000,
    )
    NIC.objects.bulk_create(
        [NIC(node_id=n, name=f"mlx5_{r}", rail=r) for n in ids for r in range(8)], batch_size=10000
    )


def measure(client, renders: int) -> tuple[list[float], int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get("/")
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        response = client.get("/")
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as queries:
        client.get("/")
    return times, len(queries.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--renders", type=int, default=20)
    args = parser.parse_args()
    scratch_database(DB_NAME, ALLOWED_HOSTS="testserver")
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane.access import Role
    from tenancy.models import Membership

    user = get_user_model().objects.create_user("bench-admin", password="x")
    Membership.objects.create(user=user, role=Role.PROVIDER_ADMIN)
    client = Client()
    client.force_login(user)
    build(args.nodes // 10)
    _, small_queries = measure(client, 3)
    build(args.nodes - args.nodes // 10, start=args.nodes // 100)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    times, queries = measure(client, args.renders)
    from fleet.models import GPU, Node

    times.sort()
    print(f"fleet: {Node.objects.count():,} nodes, {GPU.objects.count():,} GPUs")
    print(
        f"provider home render: median {statistics.median(times):.0f} ms, p95 {times[int(len(times) * 0.95) - 1]:.0f} ms "
        f"(target 150 ms: {150 / statistics.median(times):.1f}x under)"
    )
    print(
        f"SQL queries: {queries} at {Node.objects.count():,} nodes, {small_queries} at a tenth of the fleet"
    )


if __name__ == "__main__":
    main()
