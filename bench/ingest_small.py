"""Per-request cost of ONE node's telemetry batch, the load test's (issue 9): 8 GPU readings, 8 InfiniBand ports.

    .venv/bin/python bench/ingest_small.py [--seconds 20] [--nodes 1000] [--clients 2] [--facility 0] [--show]

bench/load.py has 1,000 per-node agents post every 10 s (100 POST/s), so what matters there is the fixed cost of
a request, not the cost per reading (bench/ingest_throughput.py). This sets up a scratch PostgreSQL database
(lockstep_bench_ingest_small, dropped and re-created, dropped at the end) holding one cluster of ``--nodes``
nodes with 8 GPUs and 8 NICs each, then:

1. *statements*: in this process, through the Django test client (same settings, middleware, view), posts 60
   batches and counts what goes to PostgreSQL per request — queries, COPYs, and the BEGIN/COMMIT psycopg sends —
   by wrapping psycopg's cursor and connection; ``--show`` lists one request's statements;
2. *server CPU and latency*: starts ONE uvicorn worker with production settings (controlplane.testing.settings:
   DEBUG off, plain HTTP on loopback; the web process's connection pool) in a process group of its own, warms it
   up, and has a client in a separate process post batches closed-loop over ``--clients`` connections, each from
   the next node in turn (bench/load.py's NodeAgent builds them, so the batches are the load test's). Prints the
   uvicorn process group's CPU per request (from /proc, as bench/fault_latency.py does), the CPU of the
   database's backends per request, and the per-request p50/p99; then, for scale, the CPU of a GET /healthz in
   the same server (what any request costs there: uvicorn and Django's middleware).

``--facility N`` adds N node-scope facility readings (inlet temperature, power) to every batch.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_throughput import setup  # noqa: E402
from load import NodeAgent  # noqa: E402
from procstat import cpu_by_pid, group_cpu  # noqa: E402
from scratch import PG  # noqa: E402

DB_NAME = "lockstep_bench_ingest_small"
URL_PATH = "/api/v1/ingest/telemetry/"


def node_batch(agent: NodeAgent, facility: int) -> bytes:
    import random

    body = agent.batch()
    now = body["sent_at"]
    body["facility"] = [
        {
            "ts": now,
            "source": "redfish",
            "scope": "node",
            "target": agent.hostname,
            "sensor": f"sensor-{i}",
            "metric": "inlet_temperature_celsius" if i % 2 == 0 else "power_draw_watts",
            "value": round(random.uniform(20, 30) if i % 2 == 0 else random.uniform(5000, 7000), 1),
        }
        for i in range(facility)
    ]
    return json.dumps(body).encode()


def client(url: str, token: str, nodes: int, seconds: float, clients: int, facility: int, out: str) -> None:
    """The load, in its own process: closed-loop posts; writes latencies and failures as JSON to ``out``."""
    import random

    import requests

    agents = [NodeAgent(f"node-{i:05d}", random.Random(i)) for i in range(nodes)]
    latencies, errors = [], []
    lock = threading.Lock()
    cursor = [0]
    deadline = time.monotonic() + seconds

    def worker():
        session = requests.Session()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        while time.monotonic() < deadline:
            with lock:
                agent = agents[cursor[0] % nodes]
                cursor[0] += 1
            body = node_batch(agent, facility)
            started = time.perf_counter()
            response = session.post(url, data=body, headers=headers, timeout=60)
            elapsed = time.perf_counter() - started
            with lock:
                if response.status_code == 200:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    Path(out).write_text(
        json.dumps(
            {
                "latencies": latencies,
                "errors": errors[:5],
                "error_count": len(errors),
                "elapsed": time.monotonic() - started,
            }
        )
    )


class StatementCounter:
    """Counts what psycopg sends: every execute/executemany, every COPY, and a BEGIN and a COMMIT (or ROLLBACK)
    for each transaction. Wraps the classes for the duration of a ``with`` block."""

    def __init__(self):
        self.statements: list[str] = []

    def __enter__(self):
        import psycopg

        self._saved = []
        counter = self

        def wrap(cls, name, label):
            original = getattr(cls, name)

            def wrapper(self, *args, **kwargs):
                counter.statements.append(label(args))
                return original(self, *args, **kwargs)

            self._saved.append((cls, name, original))
            setattr(cls, name, wrapper)

        def text(args):
            query = args[0] if args else ""
            return query.decode() if isinstance(query, bytes) else str(query)

        wrap(psycopg.Cursor, "execute", text)
        wrap(psycopg.Cursor, "executemany", lambda args: "(many) " + text(args))
        wrap(psycopg.Cursor, "copy", text)
        wrap(psycopg.Connection, "commit", lambda args: "BEGIN … COMMIT (2 round trips)")
        wrap(psycopg.Connection, "rollback", lambda args: "BEGIN … ROLLBACK (2 round trips)")
        return self

    def __exit__(self, *exc):
        for cls, name, original in self._saved:
            setattr(cls, name, original)

    def count(self) -> int:
        return sum(2 if s.startswith("BEGIN …") else 1 for s in self.statements)


def count_statements(token: str, nodes: int, facility: int, show: bool) -> dict:
    """Statements and in-process CPU per request of one-node batches through the Django test client."""
    import random

    from django.db import connections
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    agents = [NodeAgent(f"node-{i:05d}", random.Random(1000 + i)) for i in range(min(nodes, 60))]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for agent in agents[:10]:  # warm-up: inventory cache, compiled schema, first state rows
        response = client.post(
            URL_PATH, node_batch(agent, facility), content_type="application/json", **headers
        )
        assert response.status_code == 200, response.content
    counts, cpu = [], []
    shown = None
    for agent in agents:
        body = node_batch(agent, facility)
        with StatementCounter() as counter:
            started = time.thread_time()
            response = client.post(URL_PATH, body, content_type="application/json", **headers)
            cpu.append(time.thread_time() - started)
        assert response.status_code == 200, response.content
        counts.append(counter.count())
        if shown is None:
            shown = counter.statements
    connections.close_all()
    if show:
        print("statements of one request:")
        for statement in shown:
            print("   ", " ".join(statement.split())[:160])
    return {
        "statements": statistics.median(counts),
        "min": min(counts),
        "max": max(counts),
        "cpu_ms": statistics.median(cpu) * 1000,
    }


def backend_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to the bench database."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        pids = [
            row[0] for row in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [DB_NAME])
        ]
    return cpu_by_pid(pids)


def request_floor(pgid: int, port: int, seconds: float = 4.0) -> float:
    """CPU seconds per request of GET /healthz in the same server: what any request costs there (uvicorn, Django's
    middleware), ingest or not."""
    import requests

    session = requests.Session()
    url = f"http://127.0.0.1:{port}/healthz"
    for _ in range(20):
        session.get(url, timeout=10)
    before, count, deadline = group_cpu(pgid), 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        session.get(url, timeout=10).raise_for_status()
        count += 1
    return (group_cpu(pgid) - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=2, help="concurrent connections in the client process")
    parser.add_argument("--facility", type=int, default=0, help="facility readings per batch")
    parser.add_argument("--show", action="store_true", help="list the statements of one request")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--client", nargs=2, metavar=("URL", "TOKEN"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(
            args.client[0], args.client[1], args.nodes, args.seconds, args.clients, args.facility, args.out
        )
        return

    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/4")
    os.environ.setdefault("PYTHONWARNINGS", "ignore:No directory at")  # whitenoise, before collectstatic
    warnings.filterwarnings("ignore", message="No directory at")
    print(f"setting up {args.nodes:,} nodes / {args.nodes * 8:,} GPUs in {DB_NAME} …", flush=True)
    token = setup(
        args.nodes, DB_NAME, DATABASE_POOL_SIZE="4", LOG_LEVEL="WARNING"
    )  # the web process's pool (asgi.py)
    counted = count_statements(token, args.nodes, args.facility, args.show)
    env = dict(os.environ, LOG_LEVEL="WARNING")
    env.pop("DATABASE_POOL_SIZE")  # the web process picks its own (controlplane/asgi.py)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--port",
            str(args.port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=BASE,
        env=env,
        start_new_session=True,
    )
    try:
        import requests

        from tests.support.processes import wait_for

        wait_for(
            lambda: requests.get(f"http://127.0.0.1:{args.port}/healthz", timeout=1).ok,
            30,
            0.2,
            what="uvicorn",
        )
        url = f"http://127.0.0.1:{args.port}{URL_PATH}"
        out = f"/tmp/lockstep-ingest-small-{os.getpid()}.json"
        common = [
            "--nodes",
            str(args.nodes),
            "--clients",
            str(args.clients),
            "--facility",
            str(args.facility),
            "--out",
            out,
        ]
        subprocess.run(
            [sys.executable, __file__, "--client", url, token, "--seconds", "4", *common],
            check=True,
            cwd=BASE,
        )
        load_before = os.getloadavg()[0]
        web_before, db_before = group_cpu(server.pid), backend_cpu()
        subprocess.run(
            [sys.executable, __file__, "--client", url, token, "--seconds", str(args.seconds), *common],
            check=True,
            cwd=BASE,
        )
        web_cpu = group_cpu(server.pid) - web_before
        db_cpu = sum(seconds - db_before.get(pid, 0.0) for pid, seconds in backend_cpu().items())
        load_after = os.getloadavg()[0]
        result = json.loads(Path(out).read_text())
        Path(out).unlink()
        floor = request_floor(server.pid, args.port)
    finally:
        from tests.support.processes import stop_group

        stop_group(server)
        import psycopg

        with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
    latencies = sorted(result["latencies"])
    requests_ok = len(latencies)
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(requests_ok - 1, int(requests_ok * 0.99))] * 1000
    print(
        f"one-node batch: 8 GPU readings, 8 NICs, {args.facility} facility readings; {args.clients} connection(s), "
        f"load average {load_before:.1f} → {load_after:.1f}"
    )
    print(
        f"statements per request (in process, median of 60): {counted['statements']:.0f} "
        f"(min {counted['min']}, max {counted['max']}); in-process CPU per request {counted['cpu_ms']:.1f} ms"
    )
    print(
        f"requests: {requests_ok:,} ok in {result['elapsed']:.1f} s ({requests_ok / result['elapsed']:.0f}/s), "
        f"{result['error_count']} failed {result['errors']}"
    )
    print(
        f"uvicorn CPU per request: {web_cpu / requests_ok * 1000:.2f} ms  "
        f"(PostgreSQL backends: {db_cpu / requests_ok * 1000:.2f} ms); a GET /healthz there: {floor * 1000:.2f} ms"
    )
    print(f"per-request latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
