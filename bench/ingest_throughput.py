"""Telemetry ingest throughput: GPU readings per second through one uvicorn worker, end to end.

    .venv/bin/python bench/ingest_throughput.py [--seconds 20] [--nodes 12500] [--batch 1000] [--clients 4]

Sets up a scratch PostgreSQL database (lockstep_bench_ingest, dropped and re-created), a fleet of
``--nodes`` nodes with 8 GPUs and 8 NICs each (12,500 nodes = 100,000 GPUs), starts ONE uvicorn worker
against it and Redis, and drives it from a separate client process: relay-style batches of ``--batch``
readings (~20 dcgm fields each) plus the NIC counters of the same nodes, a few Xid events among them so
hard faults are extracted and stored as the run goes. Prints readings per second, the per-request p50 and
p99, and the target (10,000 readings/s: a 100,000-GPU fleet reporting every 10 s).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scratch import scratch_database  # noqa: E402

DB_NAME = "lockstep_bench_ingest"
TARGET = 10_000


def reading(gpu: int, node: str, ts: float, step: int) -> dict:
    return {
        "ts": ts,
        "node": node,
        "gpu": gpu,
        "uuid": f"GPU-{node}-{gpu}",
        "fields": {
            "DCGM_FI_DEV_GPU_TEMP": 55.0 + (step % 7),
            "DCGM_FI_DEV_MEMORY_TEMP": 60.0,
            "DCGM_FI_DEV_POWER_USAGE": 650.0,
            "DCGM_FI_DEV_GPU_UTIL": 97.0,
            "DCGM_FI_DEV_MEM_COPY_UTIL": 40.0,
            "DCGM_FI_DEV_FB_USED": 70_000_000_000,
            "DCGM_FI_DEV_FB_FREE": 10_000_000_000,
            "DCGM_FI_DEV_FB_TOTAL": 80_000_000_000,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": step,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": step,
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0,
            "DCGM_FI_DEV_RETIRED_SBE": 0,
            "DCGM_FI_DEV_RETIRED_DBE": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0,
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0,
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
        },
    }


def client(url: str, token: str, nodes: int, batch: int, seconds: float, clients: int, out: str) -> None:
    """The load: runs in its own process; writes latencies and counts as JSON to ``out``."""
    import requests

    per_batch_nodes = batch // 8
    latencies, accepted, faults, errors = [], [0], [0], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(offset: int):
        session = requests.Session()
        step, cursor = 0, offset * per_batch_nodes
        while time.monotonic() < deadline:
            step += 1
            ts = time.time()
            names = [f"node-{(cursor + i) % nodes:05d}" for i in range(per_batch_nodes)]
            cursor += per_batch_nodes * clients
            readings = [reading(g, name, ts, step) for name in names for g in range(8)]
            events = (
                [{"ts": ts, "node": names[0], "type": "xid", "xid": 79, "gpu": 1}] if step % 10 == 0 else []
            )
            body = json.dumps(
                {
                    "schema_version": 1,
                    "batch_id": str(uuid.uuid4()),
                    "agent": {"name": "bench", "version": "1", "hostname": "relay", "gpu_status": "ok"},
                    "created_at": ts,
                    "sent_at": ts,
                    "node": None,
                    "readings": readings,
                    "nics": [],
                    "events": events,
                    "facility": [],
                }
            )
            started = time.perf_counter()
            response = session.post(
                url,
                data=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                timeout=60,
            )
            elapsed = time.perf_counter() - started
            with lock:
                if response.status_code == 200:
                    latencies.append(elapsed)
                    accepted[0] += len(readings)
                    faults[0] += len(response.json()["faults"])
                else:
                    errors.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    Path(out).write_text(
        json.dumps(
            {
                "latencies": latencies,
                "readings": accepted[0],
                "faults": faults[0],
                "errors": errors[:5],
                "error_count": len(errors),
                "elapsed": time.monotonic() - started,
            }
        )
    )


def setup(nodes: int, database: str = DB_NAME, **environment: str) -> str:
    """A scratch database with one cluster of ``nodes`` nodes (8 GPUs, 8 NICs each); returns an agent token."""
    scratch_database(database, **environment)
    from fleet.models import GPU, NIC, Cluster, Fleet, Node
    from telemetry.services.tokens import agent_token_create

    fleet = Fleet.objects.create(name="bench")
    cluster = Cluster.objects.create(fleet=fleet, name="bench-cluster")
    Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"node-{i:05d}",
                gpu_model="H100",
                rack=f"r{i // 32}",
                leaf_switch=f"leaf-{i // 32}",
            )
            for i in range(nodes)
        ],
        batch_size=5000,
    )
    ids = list(Node.objects.filter(cluster=cluster).values_list("id", flat=True))
    GPU.objects.bulk_create(
        [GPU(node_id=n, index=g, uuid=f"GPU-{n}-{g}", model="H100") for n in ids for g in range(8)],
        batch_size=10000,
    )
    NIC.objects.bulk_create(
        [NIC(node_id=n, name=f"mlx5_{r}", rail=r) for n in ids for r in range(8)], batch_size=10000
    )
    _, token = agent_token_create(actor=None, cluster=cluster, name="bench")
    return token


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--batch", type=int, default=1000, help="readings per request (a multiple of 8)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent connections in the client process")
    parser.add_argument("--client", nargs=2, metavar=("URL", "TOKEN"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args.client[0], args.client[1], args.nodes, args.batch, args.seconds, args.clients, args.out)
        return

    print(f"setting up {args.nodes:,} nodes / {args.nodes * 8:,} GPUs in {DB_NAME} …", flush=True)
    token = setup(args.nodes)
    port = 8790
    env = dict(os.environ, LOG_LEVEL="WARNING")
    env.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--port",
            str(port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=BASE,
        env=env,
    )
    try:
        import requests

        for _ in range(100):
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/api/v1/ingest/telemetry/"
        out = "/tmp/lockstep-ingest-bench.json"
        # warm-up: loads the inventory cache and the compiled schema
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--client",
                url,
                token,
                "--seconds",
                "3",
                "--nodes",
                str(args.nodes),
                "--batch",
                str(args.batch),
                "--clients",
                "1",
                "--out",
                out,
            ],
            check=True,
            cwd=BASE,
        )
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--client",
                url,
                token,
                "--seconds",
                str(args.seconds),
                "--nodes",
                str(args.nodes),
                "--batch",
                str(args.batch),
                "--clients",
                str(args.clients),
                "--out",
                out,
            ],
            check=True,
            cwd=BASE,
        )
        result = json.loads(Path(out).read_text())
    finally:
        server.terminate()
        server.wait(20)
    latencies = sorted(result["latencies"])
    rate = result["readings"] / result["elapsed"]
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(f"requests: {len(latencies):,} ok, {result['error_count']} failed {result['errors']}")
    print(
        f"readings accepted: {result['readings']:,} in {result['elapsed']:.1f} s; hard faults extracted: {result['faults']}"
    )
    print(f"readings per second: {rate:,.0f}  (target {TARGET:,}: {rate / TARGET:.2f}x)")
    print(f"per-request latency ({args.batch} readings): p50 {p50:.0f} ms, p99 {p99:.0f} ms")


if __name__ == "__main__":
    main()
