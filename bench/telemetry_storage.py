"""How big telemetry grows per 1,000 GPUs per day.

    .venv/bin/python bench/telemetry_storage.py [--minutes 60]

Ingests ``--minutes`` of readings for 1,000 GPUs (125 nodes × 8, one reading every 10 s, with their NICs)
through the real ingest service into a scratch PostgreSQL database (lockstep_bench_storage), measures each
telemetry table with pg_total_relation_size, and scales to a day.
"""

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
sys.path.insert(0, str(BASE / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_database  # noqa: E402

DB_NAME = "lockstep_bench_storage"
TABLES = [
    "telemetry_gpusample",
    "telemetry_nodeminute",
    "telemetry_gpustate",
    "telemetry_nicstate",
    "telemetry_ingestbatch",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=int, default=60)
    args = parser.parse_args()
    scratch_database(DB_NAME, TELEMETRY_RAW_RETENTION_HOURS="48")
    from django.db import connection
    from ingest_throughput import reading

    from fleet.models import GPU, NIC, Cluster, Fleet, Node
    from telemetry.services.ingest import telemetry_ingest

    cluster = Cluster.objects.create(fleet=Fleet.objects.create(name="storage"), name="storage")
    Node.objects.bulk_create(
        [Node(cluster=cluster, hostname=f"node-{i:05d}", gpu_model="H100") for i in range(125)]
    )
    ids = list(Node.objects.values_list("id", flat=True))
    GPU.objects.bulk_create(
        [GPU(node_id=n, index=g, uuid=f"GPU-{n}-{g}", model="H100") for n in ids for g in range(8)]
    )
    NIC.objects.bulk_create([NIC(node_id=n, name=f"mlx5_{r}", rail=r) for n in ids for r in range(8)])
    steps = args.minutes * 6
    start = time.time() - steps * 10
    for step in range(steps):
        ts = start + step * 10
        names = [f"node-{i:05d}" for i in range(125)]
        nics = [
            {
                "ts": ts,
                "node": name,
                "name": f"mlx5_{r}",
                "kind": "infiniband",
                "link_state": "up",
                "fields": {
                    "link_downed": 0,
                    "symbol_error": step,
                    "link_error_recovery": 0,
                    "port_rcv_errors": 0,
                },
            }
            for name in names
            for r in range(8)
        ]
        body = json.dumps(
            {
                "schema_version": 1,
                "batch_id": str(uuid.uuid4()),
                "agent": {"name": "bench", "version": "1", "hostname": "relay", "gpu_status": "ok"},
                "created_at": time.time(),
                "sent_at": time.time(),
                "node": None,
                "readings": [reading(g, name, ts, step) for name in names for g in range(8)],
                "nics": nics,
                "events": [],
                "facility": [],
            }
        ).encode()
        telemetry_ingest(cluster=cluster, body=body)
    with connection.cursor() as cursor:
        # Latest-state rows are updated in place every reading; VACUUM FULL measures their live size (autovacuum
        # keeps a running system near it, plus the dead tuples between its passes).
        cursor.execute("VACUUM FULL ANALYZE")
        sizes = {}
        for table in TABLES:
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            sizes[table] = cursor.fetchone()[0]
    scale = 24 * 60 / args.minutes
    print(f"1,000 GPUs, one reading every 10 s, {args.minutes} min ingested ({steps * 1000:,} readings)")
    growing = {
        "telemetry_gpusample": "raw samples (kept TELEMETRY_RAW_RETENTION_HOURS, default 24 h)",
        "telemetry_nodeminute": "per-minute history (kept TELEMETRY_HISTORY_DAYS, default 30 d)",
        "telemetry_ingestbatch": "batch ids (kept with the raw samples)",
    }
    for table, size in sizes.items():
        if table in growing:
            print(
                f"  {table:24s} {size / 2**20:8.1f} MiB now -> {size * scale / 2**20:8.1f} MiB per day  {growing[table]}"
            )
        else:
            print(f"  {table:24s} {size / 2**20:8.1f} MiB (latest state: does not grow with time)")
    raw_day = sizes["telemetry_gpusample"] * scale + sizes["telemetry_ingestbatch"] * scale
    history_day = sizes["telemetry_nodeminute"] * scale
    print(
        f"steady state at default retention: {raw_day / 2**30:.2f} GiB raw (1 day) + "
        f"{history_day * 30 / 2**30:.2f} GiB history (30 days) per 1,000 GPUs"
    )


if __name__ == "__main__":
    main()
