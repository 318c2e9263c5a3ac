"""Load test (issue 9): the real stack held for a minute under a fleet's telemetry, websocket clients and faults.

    .venv/bin/python bench/load.py                        # 1,000 nodes, 200 clients, 20 faults/s, 60 s
    .venv/bin/python bench/load.py --nodes 100 --clients 20 --fault-rate 2 --seconds 10 --warmup 3

What runs: a scratch PostgreSQL database (lockstep_bench_load, dropped and re-created; dropped again at the
end unless --keep) owned by a role of the same name whose connections are capped (--db-connection-limit, 50: the
server is shared, and the stack must not take its every connection), Redis DB 6 (flushed), and the stack as
production runs it (settings with DEBUG off, on plain HTTP), each a subprocess: uvicorn with
``--workers 2`` (Django runs each request's sync code on a thread of its own, but a process's Python runs one
thread at a time, so production runs several: WEB_CONCURRENCY), a Celery worker (``--concurrency 2``) and
beat. The world: 4 protected simulated clusters, ``--nodes`` nodes in all (8 GPUs, 8 NICs each; 8 spares per
cluster, one 8-GPU job on every node but the spares, the jobs shared between two tenants), an agent token per cluster.

The load, open-loop (a request goes out when it is due, whether or not earlier ones have been answered):

- telemetry: every node posts one batch every ``--interval`` seconds (10 s), as the node agent does for one
  node (``node`` set, 8 GPU readings with the agent's dcgm fields, 8 InfiniBand ports with their counters),
  with its cluster's agent token; the nodes' posts are spread evenly over the interval;
- faults: ``--fault-rate`` ``nic_down`` reports a second on distinct (node, NIC) pairs, POSTed to
  /api/v1/faults/ by a provider admin's token; each is answered by a NIC failover;
- websockets: ``--clients`` clients with Bearer API tokens — a tenth of them provider operators on ``fleet``,
  the rest tenant viewers of two tenants, each on ``--job-topics`` ``job-<id>`` topics of its own tenant's
  jobs. A client that loses its socket reconnects, subscribes again and catches up from /api/v1/events/.

Two client processes drive it (HTTP with aiohttp, websockets with ``websockets``, both asyncio) so that the
websocket clock is not held up by request building. Measured over the hold window (after ``--warmup``):
per-endpoint API latency (request issued → response read); fault-to-decision latency (POST sent → first
action event carrying the fault received on any ``fleet`` socket); websocket delivery delay (receive time −
the event's ``created``, one machine clock); events lost (every event the database holds for a subscribed
topic, created between the client's subscription and the end of the load, against what the client got);
non-2xx answers by status; offered vs. achieved rates; and each process's memory (RSS, PSS, USS from
/proc/<pid>/smaps_rollup; peak and end) and CPU share. Also sampled for diagnosis: the Celery queue length,
what PostgreSQL backends of the bench database wait on, and the machine's load average (it is shared).
Loopback only; every wait is bounded.
"""

import argparse
import asyncio
import collections
import heapq
import json
import os
import random
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import TICKS, named, proc_stat  # noqa: E402

DB_NAME = "lockstep_bench_load"
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
LOGS = Path(os.environ.get("BENCH_LOG_DIR", "/tmp/lockstep-bench-load"))
CLUSTERS, SPARES, NICS, GPUS = 4, 8, 8, 8


# --- the world ---------------------------------------------------------------------------------------------


def build_world(nodes: int, clients: int, job_topics: int, seed: int) -> dict:
    """Clusters, nodes, jobs, tenants, users and tokens; returns what the client processes need."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from fleet.choices import HealthStatus, NodeState, SyncStatus
    from fleet.models import GPU, NIC, Blueprint, BlueprintVersion, Cluster, Fleet, Node, ObservedAddon
    from jobs.models import Job, JobAllocation
    from telemetry.services.tokens import agent_token_create
    from tenancy.models import Membership, Tenant
    from tenancy.services import token_create

    users = get_user_model().objects
    admin = users.create_user("load-admin", password="x" * 20)
    Membership.objects.create(user=admin, role="provider-admin")
    _, admin_token = token_create(actor=admin, owner=admin, name="load", scope="write")
    tenants = [Tenant.objects.create(name=f"Load {name}", slug=f"load-{name}") for name in ("a", "b")]
    blueprint = Blueprint.objects.create(name="load", auto_rollout=False)
    version = BlueprintVersion.objects.create(
        blueprint=blueprint,
        number=1,
        state="active",
        policy={"protection": {"nic_failover": True, "live_migration": True}},
    )
    fleet = Fleet.objects.create(name="load", max_cordoned_nodes=10_000, max_draining_nodes=10_000)
    now = timezone.now()
    agents, targets, jobs_of = [], [], {t.pk: [] for t in tenants}
    for c in range(CLUSTERS):
        count = nodes // CLUSTERS + (1 if c < nodes % CLUSTERS else 0)
        cluster = Cluster.objects.create(
            fleet=fleet,
            name=f"load-{c}",
            blueprint=blueprint,
            blueprint_version=version,
            connection={"nic_failover_seconds": 1, "migration_pause_seconds": 30},
        )
        for name in ("nic-failover", "live-migration"):
            ObservedAddon.objects.create(
                cluster=cluster,
                name=name,
                sync=SyncStatus.IN_SYNC,
                health=HealthStatus.HEALTHY,
                observed_at=now,
            )
        spares = min(SPARES, count // 4)
        rows = Node.objects.bulk_create(
            [
                Node(
                    cluster=cluster,
                    hostname=f"l{c}-{i:04d}",
                    gpu_model="H100",
                    leaf_switch=f"leaf-{i // 32}",
                    rack=f"rack-{i // 32}",
                    state=NodeState.SPARE if i >= count - spares else NodeState.READY,
                )
                for i in range(count)
            ]
        )
        GPU.objects.bulk_create(
            [
                GPU(node=n, index=i, uuid=f"GPU-{uuid.uuid4()}", model="H100")
                for n in rows
                for i in range(GPUS)
            ],
            batch_size=5000,
        )
        NIC.objects.bulk_create(
            [NIC(node=n, name=f"mlx5_{i}", rail=i) for n in rows for i in range(NICS)], batch_size=5000
        )
        busy = rows[: count - spares]
        jobs = Job.objects.bulk_create(
            [
                Job(
                    tenant=tenants[i % 2],
                    cluster=cluster,
                    name=f"load-{c}-{i}",
                    gpus=GPUS,
                    state="Running",
                    checkpoint_interval=10**9,
                    iteration_at=now,
                    started_at=now,
                )
                for i in range(len(busy))
            ]
        )
        JobAllocation.objects.bulk_create(
            [
                JobAllocation(job=j, node=n, gpu_indices=list(range(GPUS)), rank_start=0, rank_end=GPUS - 1)
                for j, n in zip(jobs, busy, strict=True)
            ]
        )
        for job in jobs:
            jobs_of[job.tenant_id].append(job.pk)
        _, agent_token = agent_token_create(actor=None, cluster=cluster, name="load")
        agents.append({"token": agent_token, "nodes": [n.hostname for n in rows]})
        targets += [(n.pk, f"mlx5_{k}") for n in busy for k in range(1, NICS)]
    # NIC by NIC, clusters interleaved: consecutive faults land on different nodes and clusters.
    targets.sort(key=lambda t: (int(t[1].split("_")[1]), t[0] % CLUSTERS, t[0]))

    providers = max(1, clients // 10)
    plan_clients = []
    for i in range(providers):
        user = users.create_user(f"load-operator-{i}", password="x" * 20)
        Membership.objects.create(user=user, role="operator")
        _, raw = token_create(actor=user, owner=user, name="load", scope="read")
        plan_clients.append({"name": f"operator-{i}", "token": raw, "topics": ["fleet"], "fleet": True})
    rng = random.Random(seed)
    pools = {pk: rng.sample(ids, len(ids)) for pk, ids in jobs_of.items()}
    for i in range(clients - providers):
        tenant = tenants[i % 2]
        user = users.create_user(f"load-viewer-{i}", password="x" * 20)
        Membership.objects.create(user=user, role="tenant-viewer", tenant=tenant)
        _, raw = token_create(actor=user, owner=user, name="load", scope="read")
        pool = pools[tenant.pk]
        start = (i // 2) * job_topics
        topics = [f"job-{pool[(start + k) % len(pool)]}" for k in range(job_topics)]
        plan_clients.append(
            {"name": f"viewer-{tenant.slug}-{i}", "token": raw, "topics": topics, "fleet": False}
        )
    return {
        "admin_token": admin_token,
        "agents": agents,
        "targets": targets,
        "clients": plan_clients,
        "jobs": sum(len(v) for v in jobs_of.values()),
    }


# --- the HTTP client process -------------------------------------------------------------------------------

DCGM_STEADY = {
    "DCGM_FI_DEV_MEMORY_TEMP": 62.0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0,
    "DCGM_FI_DEV_FB_USED": 71_000_000_000,
    "DCGM_FI_DEV_FB_FREE": 9_000_000_000,
    "DCGM_FI_DEV_FB_TOTAL": 80_000_000_000,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 3,
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 0,
    "DCGM_FI_DEV_RETIRED_SBE": 0,
    "DCGM_FI_DEV_RETIRED_DBE": 0,
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
    "DCGM_FI_DEV_XID_ERRORS": 0,
}


class NodeAgent:
    """One simulated node agent: the batch it sends now (8 GPUs, 8 InfiniBand ports, steady and healthy)."""

    def __init__(self, hostname: str, rng: random.Random):
        self.hostname, self.rng = hostname, rng
        self.base = [rng.uniform(52, 68) for _ in range(GPUS)]
        self.xmit_wait = [rng.randint(0, 10**6) for _ in range(NICS)]
        self.bytes = [rng.randint(0, 10**12) for _ in range(NICS)]

    def batch(self) -> dict:
        now, rng = time.time(), self.rng
        readings = [
            {
                "ts": now,
                "gpu": g,
                "uuid": f"GPU-{self.hostname}-{g}",
                "model": "NVIDIA H100 80GB HBM3",
                "fields": {
                    "DCGM_FI_DEV_GPU_TEMP": round(self.base[g] + rng.gauss(0, 0.8), 1),
                    "DCGM_FI_DEV_POWER_USAGE": round(rng.uniform(580, 690), 1),
                    "DCGM_FI_DEV_GPU_UTIL": round(rng.uniform(88, 99), 1),
                    **DCGM_STEADY,
                },
            }
            for g in range(GPUS)
        ]
        nics = []
        for n in range(NICS):
            self.xmit_wait[n] += rng.randint(20, 200)
            self.bytes[n] += rng.randint(10**9, 2 * 10**9)
            nics.append(
                {
                    "ts": now,
                    "name": f"mlx5_{n}",
                    "kind": "infiniband",
                    "link_state": "up",
                    "ib_device": f"mlx5_{n}",
                    "ib_port": 1,
                    "ib_state": "ACTIVE",
                    "ib_phys_state": "LinkUp",
                    "speed_bps": 400_000_000_000,
                    "fields": {
                        "symbol_error": 0,
                        "link_downed": 0,
                        "link_error_recovery": 0,
                        "port_rcv_errors": 0,
                        "port_rcv_remote_physical_errors": 0,
                        "port_xmit_discards": 0,
                        "local_link_integrity_errors": 0,
                        "excessive_buffer_overrun_errors": 0,
                        "port_xmit_wait": self.xmit_wait[n],
                        "rx_bytes": self.bytes[n],
                        "tx_bytes": self.bytes[n],
                    },
                }
            )
        return {
            "schema_version": 1,
            "batch_id": str(uuid.uuid4()),
            "agent": {
                "name": "lockstep-agent",
                "version": "0.1.0",
                "hostname": self.hostname,
                "gpu_status": "ok",
                "driver_version": "550.90.07",
            },
            "created_at": now,
            "sent_at": now,
            "node": self.hostname,
            "readings": readings,
            "nics": nics,
            "events": [],
            "facility": [],
        }


def _schedule(plan: dict):
    """(due, kind, argument) in time order: every node's batch each interval (spread), and the faults."""
    t0, end, interval = plan["t0"], plan["end"], plan["interval"]
    nodes = [
        (hostname, cluster) for cluster, agent in enumerate(plan["agents"]) for hostname in agent["nodes"]
    ]
    # Interleave clusters so each moment's batches come from every cluster.
    nodes.sort(key=lambda item: (int(item[0].split("-")[1]), item[1]))

    def telemetry():
        cycle = 0
        while True:
            for i, node in enumerate(nodes):
                due = t0 + cycle * interval + i * interval / len(nodes)
                if due >= end:
                    return
                yield due, "telemetry", node
            cycle += 1

    def faults():
        if plan["fault_rate"] <= 0:
            return
        for j, target in enumerate(plan["targets"]):
            due = t0 + j / plan["fault_rate"]
            if due >= end:
                return
            yield due, "fault", target

    return heapq.merge(telemetry(), faults(), key=lambda item: item[0])


async def http_client(plan: dict, out: Path) -> None:
    import aiohttp
    import orjson

    rng = random.Random(plan["seed"])
    agents = {hostname: NodeAgent(hostname, rng) for agent in plan["agents"] for hostname in agent["nodes"]}
    records, faults = [], []
    url = plan["url"]
    connector = aiohttp.TCPConnector(limit=plan["connections"])
    timeout = aiohttp.ClientTimeout(total=plan["request_timeout"])

    async def post(session, kind: str, due: float, argument) -> None:
        if kind == "telemetry":
            hostname, cluster = argument
            body = orjson.dumps(agents[hostname].batch())
            token, path = plan["agents"][cluster]["token"], "/api/v1/ingest/telemetry/"
        else:
            node, nic = argument
            body = orjson.dumps({"node": node, "kind": "nic_down", "nic_name": nic, "source": "agent"})
            token, path = plan["admin_token"], "/api/v1/faults/"
        sent = time.time()
        status, fault_id = None, None
        try:
            async with session.post(
                url + path,
                data=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            ) as response:
                text = await response.read()
                status = response.status
                if kind == "fault" and status in (200, 201):
                    fault_id = orjson.loads(text)["id"]
                elif status >= 300 and len(errors_seen) < 20:
                    errors_seen.append(f"{kind} {status} {text[:300].decode(errors='replace')}")
        except TimeoutError:
            status = "timeout"
        except aiohttp.ClientError as error:
            status = type(error).__name__
        done = time.time()
        records.append((kind, due, sent, done, status))
        if fault_id is not None:
            faults.append((fault_id, due, sent, done))

    errors_seen: list[str] = []
    tasks: set[asyncio.Task] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for due, kind, argument in _schedule(plan):
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(post(session, kind, due, argument))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks), timeout=plan["request_timeout"] + 5)
    out.write_text(json.dumps({"records": records, "faults": faults, "errors_seen": errors_seen}))


# --- the websocket client process --------------------------------------------------------------------------


async def ws_clients(plan: dict, out: Path) -> None:
    import aiohttp
    import orjson
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url, ws_url = plan["url"], plan["url"].replace("http://", "ws://") + "/ws/events/"
    stop = asyncio.Event()
    first_action: dict[int, float] = {}
    delays = {"fleet": [], "job": []}  # [created, delay] per event received live
    state = [
        {
            "name": c["name"],
            "topics": c["topics"],
            "fleet": c["fleet"],
            "subscribed_at": None,
            "live": collections.defaultdict(list),
            "caught_up": collections.defaultdict(list),
            "last": {},
            "reconnects": 0,
            "refused": [],
            "duplicates": 0,
        }
        for c in plan["clients"]
    ]
    lag = []
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def open_socket(client: dict, mine: dict):
        ws = await connect(
            ws_url,
            additional_headers={"Authorization": f"Bearer {client['token']}"},
            open_timeout=30,
            max_size=None,
            max_queue=None,
        )
        hello = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        if hello.get("type") != "hello":
            raise RuntimeError(f"{client['name']}: expected hello, got {hello}")
        await ws.send(json.dumps({"subscribe": client["topics"]}))
        while True:  # events of earlier subscriptions cannot come yet: the first answer is the subscription's
            answer = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            if answer.get("type") == "subscribed":
                break
        mine["refused"] = answer["refused"]
        for topic, head in (answer.get("heads") or {}).items():  # where each topic stood when we joined
            mine["last"].setdefault(topic, head)
        return ws

    async def catch_up(client: dict, mine: dict, topics=None) -> None:
        for topic in topics or client["topics"]:
            after = mine["last"].get(topic, 0)
            page = f"{url}/api/v1/events/?topic={topic}&after={after}&page_size=500"
            while page:
                async with http.get(page, headers={"Authorization": f"Bearer {client['token']}"}) as response:
                    body = await response.json()
                for event in body["results"]:
                    mine["caught_up"][topic].append(event["seq"])
                    mine["last"][topic] = max(mine["last"].get(topic, 0), event["seq"])
                page = body.get("next")

    def note(mine: dict, event: dict, now: float) -> None:
        topic, seq = event["topic"], event["seq"]
        if seq <= mine["last"].get(topic, 0) and seq in mine["live"][topic]:
            mine["duplicates"] += 1
            return
        mine["live"][topic].append(seq)
        mine["last"][topic] = max(mine["last"].get(topic, 0), seq)
        created = datetime.fromisoformat(event["created"]).timestamp()
        delays["fleet" if topic == "fleet" else "job"].append((created, now - created))
        kind = event["kind"]
        if mine["fleet"] and (kind == "actions.decided" or kind.startswith("action.")):
            payload = event["payload"]
            for action in payload.get("actions") or [payload]:
                if action.get("fault") and action["fault"] not in first_action:
                    first_action[action["fault"]] = now

    async def run_client(index: int, client: dict, mine: dict) -> None:
        while not stop.is_set():
            try:
                async for raw in sockets[index]:
                    now = time.time()
                    event = orjson.loads(raw)
                    if event.get("type") == "event":
                        # As static/js/live.js: a sequence number that jumps means events were missed live:
                        # fetch them from the API first.
                        if event["topic"] in mine["last"] and event["seq"] > mine["last"][event["topic"]] + 1:
                            await catch_up(client, mine, [event["topic"]])
                        note(mine, event, now)
                    elif event.get("type") == "heads":  # the consumer says a topic went further than we saw
                        behind = [t for t, head in event["heads"].items() if head > mine["last"].get(t, 0)]
                        if behind:
                            await catch_up(client, mine, behind)
            except ConnectionClosed:
                pass
            if stop.is_set():
                return
            mine["reconnects"] += 1
            for attempt in range(30):
                try:
                    sockets[index] = await open_socket(client, mine)
                    await catch_up(client, mine)
                    break
                except Exception:  # the server is away or overloaded: try again, a bounded number of times
                    await asyncio.sleep(min(5, 0.5 * (attempt + 1)))
            else:
                return

    async def lag_meter() -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.1)
            lag.append(time.perf_counter() - before - 0.1)

    gate = asyncio.Semaphore(10)

    async def connect_one(client: dict, mine: dict):
        async with gate:
            ws = await open_socket(client, mine)
            mine["subscribed_at"] = time.time()
            return ws

    sockets = await asyncio.gather(*(connect_one(c, m) for c, m in zip(plan["clients"], state, strict=True)))
    Path(plan["ready_file"]).write_text("ready")
    runners = [
        asyncio.create_task(run_client(i, c, m))
        for i, (c, m) in enumerate(zip(plan["clients"], state, strict=True))
    ]
    meter = asyncio.create_task(lag_meter())
    stop_file = Path(plan["stop_file"])
    deadline = time.time() + plan["ws_deadline"]
    while not stop_file.exists() and time.time() < deadline:
        await asyncio.sleep(0.2)
    stop.set()
    for ws in sockets:
        await ws.close()
    await asyncio.wait(runners, timeout=10)
    await meter
    await http.close()
    for mine in state:
        mine["live"], mine["caught_up"] = dict(mine["live"]), dict(mine["caught_up"])
    lag.sort()
    out.write_text(
        json.dumps(
            {
                "clients": state,
                "first_action": first_action,
                "delays": delays,
                "lag_p99_ms": lag[int(0.99 * (len(lag) - 1))] * 1000 if lag else 0,
                "lag_max_ms": lag[-1] * 1000 if lag else 0,
            }
        )
    )


def client_main(role: str, plan_path: str, out: str) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    plan = json.loads(Path(plan_path).read_text())
    asyncio.run((http_client if role == "http" else ws_clients)(plan, Path(out)))


# --- processes, memory and CPU -----------------------------------------------------------------------------


def memory(pid: int) -> dict | None:
    """RSS, PSS and USS (private clean + dirty) in bytes, from smaps_rollup."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[name] = int(parts[0]) * 1024
    try:
        threads = int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)[1])
    except (OSError, TypeError):
        threads = 0
    return {
        "rss": values.get("Rss", 0),
        "pss": values.get("Pss", 0),
        "threads": threads,
        "uss": values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
    }


def listening(port: int) -> list[int]:
    """The process listening on a TCP port."""
    try:
        listing = subprocess.run(
            ["ss", "-ltnpH", f"( sport = :{port} )"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({int(pid) for pid in re.findall(r"pid=(\d+)", listing)})


def postgres_cpu() -> float | None:
    """CPU seconds of the whole PostgreSQL server: the postmaster, its live children, and (cutime, cstime) the
    children it has reaped — short-lived backends that no sample would see."""
    total, found = 0.0, False
    pids = set(named("postgres"))
    for pid in pids:
        stat = proc_stat(pid)
        if stat is None:
            continue
        total += stat.cpu
        if stat.ppid not in pids:  # the postmaster
            total += stat.reaped_cpu
            found = True
    return total if found else None


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat and stat.ppid == pid:
                try:
                    if b"resource_tracker" in (entry / "cmdline").read_bytes():
                        continue
                except OSError:
                    continue
                found.append(int(entry.name))
    return sorted(found)


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / TICKS, sum(fields[:8]) / TICKS


class Sampler(threading.Thread):
    """Every ``every`` seconds: memory and CPU of each labelled process, PostgreSQL backends of the bench
    database (and what they wait on), the whole PostgreSQL server, Redis, the Celery queue, the load average."""

    def __init__(self, groups, every: float = 2.0):
        super().__init__(daemon=True)
        self.groups, self.every = groups, every  # groups: {label: callable returning pids}
        self.samples: list[dict] = []
        self.waits = collections.Counter()
        self.active_queries = collections.Counter()
        self.queue = []
        self.stop = threading.Event()

    def one(self) -> dict:
        import psycopg
        import redis

        now = time.time()
        sample = {"t": now, "load": os.getloadavg()[0], "machine": machine_busy(), "procs": {}}
        for label, pids in self.groups.items():
            for pid in pids():
                stat, mem = proc_stat(pid), memory(pid)
                if stat and mem:
                    sample["procs"][(label, pid)] = {**mem, "cpu": stat.cpu}
        try:
            with psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=5) as conn:
                rows = conn.execute(
                    "SELECT pid, state, wait_event_type, wait_event, left(query, 90) "
                    "FROM pg_stat_activity WHERE datname = %s",
                    [DB_NAME],
                ).fetchall()
                sample["sessions"] = conn.execute(
                    "SELECT sessions FROM pg_stat_database WHERE datname = %s", [DB_NAME]
                ).fetchone()[0]
        except psycopg.Error:
            rows = []
        sample["backends"] = collections.Counter(status or "?" for _, status, *_ in rows)
        for pid, status, wait_type, wait, query in rows:
            stat, mem = proc_stat(pid), memory(pid)
            if stat and mem:
                sample["procs"][("postgres backends (bench db)", pid)] = {**mem, "cpu": stat.cpu}
            if status and status != "idle":
                self.waits[f"{status}: {wait_type}:{wait}" if wait_type else f"{status}: on CPU"] += 1
                self.active_queries[" ".join((query or "").split())[:90]] += 1
        # Which of the stack's processes hold the PostgreSQL connections (client side of each socket).
        try:
            listing = subprocess.run(
                ["ss", "-tnpH", "state", "established", "( dport = :5432 )"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            listing = ""
        sample["pg_sockets"] = collections.Counter(int(pid) for pid in re.findall(r"pid=(\d+)", listing))
        for pid in named("postgres"):
            stat, mem = proc_stat(pid), memory(pid)
            if stat and mem:
                sample["procs"][("postgres server (all databases)", pid)] = {**mem, "cpu": stat.cpu}
        try:
            client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
            depth = client.llen("celery")
            used = client.info("memory")["used_memory"]
        except redis.RedisError:
            depth, used = None, None
        sample["celery_queue"], sample["redis_used"] = depth, used
        sample["postgres_cpu"] = postgres_cpu()
        return sample

    def run(self):
        while not self.stop.is_set():
            began = time.time()
            self.samples.append(self.one())
            self.stop.wait(max(0.1, self.every - (time.time() - began)))


def summarise_processes(samples: list[dict], window: tuple[float, float]) -> list[tuple]:
    """Per label (and per pid for the stack's own processes): peak and end memory, CPU share in the window."""
    inside = [s for s in samples if window[0] <= s["t"] <= window[1]] or samples
    end = samples[-1]
    per_pid_labels = {
        "uvicorn worker",
        "celery worker (main)",
        "celery pool child",
        "celery beat",
        "uvicorn master",
        "load client: http",
        "load client: websockets",
        "this process",
    }
    keys = collections.OrderedDict()
    for s in samples:
        for label, pid in s["procs"]:
            keys.setdefault(label, set()).add(pid)
    rows = []
    for label, pids in keys.items():
        groups = [[pid] for pid in sorted(pids)] if label in per_pid_labels else [sorted(pids)]
        for group in groups:

            def total(sample, field, group=group, label=label):
                return sum(sample["procs"].get((label, pid), {}).get(field, 0) for pid in group)

            peak = {f: max(total(s, f) for s in samples) for f in ("rss", "pss", "uss", "threads")}
            last = {f: total(end, f) for f in ("rss", "pss", "uss")}
            # CPU in the window: for each pid, its last value in the window minus its first (0 if born inside).
            cpu = 0.0
            for pid in group:
                seen = [s["procs"][(label, pid)]["cpu"] for s in inside if (label, pid) in s["procs"]]
                if seen:
                    born_inside = inside[0]["procs"].get((label, pid)) is None
                    cpu += seen[-1] - (0.0 if born_inside else seen[0])
            span = max(1e-9, inside[-1]["t"] - inside[0]["t"])
            name = label if len(group) > 1 or label not in per_pid_labels else f"{label} {group[0]}"
            if len(group) > 1:
                name += f" ({len(group)} pids seen)"
            rows.append(
                (name, peak, last, cpu / span, all((label, pid) not in end["procs"] for pid in group))
            )
    return rows


# --- the run -----------------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))] if values else float("nan")


def start(cmd: list[str], log: Path, db_url: str) -> subprocess.Popen:
    env = dict(
        os.environ, DATABASE_URL=db_url, REDIS_URL=REDIS_URL, PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING"
    )
    return subprocess.Popen(
        cmd, cwd=BASE, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def mib(value: float) -> str:
    return f"{value / 2**20:8.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "--nodes", type=int, default=1000, help="simulated nodes posting telemetry (all clusters)"
    )
    parser.add_argument("--interval", type=float, default=10, help="seconds between one node's batches")
    parser.add_argument("--clients", type=int, default=200, help="websocket clients (a tenth on fleet)")
    parser.add_argument("--job-topics", type=int, default=3, help="job topics per tenant-viewer client")
    parser.add_argument("--fault-rate", type=float, default=20, help="faults POSTed per second")
    parser.add_argument("--seconds", type=float, default=60, help="hold, measured")
    parser.add_argument("--warmup", type=float, default=10, help="full load before the hold, not measured")
    parser.add_argument(
        "--drain", type=float, default=30, help="at most this long after the load for the last events"
    )
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--web-args", default="", help='more uvicorn options, e.g. "--limit-concurrency 32"')
    parser.add_argument(
        "--connections", type=int, default=400, help="most HTTP connections the load client opens"
    )
    parser.add_argument(
        "--db-connection-limit",
        type=int,
        default=50,
        help="most PostgreSQL connections the stack may open (a role limit: the server is shared)",
    )
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--role", choices=["http", "ws"], help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        client_main(args.role, args.plan, args.out)
        return 0

    LOGS.mkdir(parents=True, exist_ok=True)
    for stale in LOGS.glob("*"):
        stale.unlink()
    load_before = os.getloadavg()
    print(
        f"load average before (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in load_before)} on {os.cpu_count()} CPUs",
        flush=True,
    )
    # Production settings (DEBUG off) on plain HTTP: loopback has no TLS proxy in front.
    os.environ.update(DEBUG="false", PLAIN_HTTP="true", LOG_LEVEL="WARNING")
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()
    started = time.time()
    db_url = scratch_database(args.db_connection_limit)
    world = build_world(args.nodes, args.clients, args.job_topics, args.seed)
    from tests.support.processes import free_port, stop_group, wait_for  # Django is set up now

    needed = int(args.fault_rate * (args.warmup + args.seconds)) + 1
    if len(world["targets"]) < needed:
        print(
            f"only {len(world['targets'])} distinct (node, NIC) pairs for {needed} faults: fewer nodes or faults"
        )
        return 2
    print(
        f"world: {args.nodes} nodes ({CLUSTERS} clusters, {world['jobs']} jobs of two tenants, spares), "
        f"{len(world['clients'])} websocket users, built in {time.time() - started:.1f} s",
        flush=True,
    )
    from django.db import connections

    connections.close_all()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    venv = Path(sys.executable).parent
    web = start(
        [
            str(venv / "uvicorn"),
            "controlplane.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--workers",
            str(args.web_workers),
            *args.web_args.split(),
        ],
        LOGS / "uvicorn.log",
        db_url,
    )
    worker = start(
        [
            str(venv / "celery"),
            "-A",
            "controlplane",
            "worker",
            "--loglevel=warning",
            f"--concurrency={args.worker_concurrency}",
            "-n",
            f"load-{port}@%h",
            "--without-gossip",
            "--without-mingle",
        ],
        LOGS / "celery-worker.log",
        db_url,
    )
    beat = start(
        [
            str(venv / "celery"),
            "-A",
            "controlplane",
            "beat",
            "--loglevel=warning",
            "--schedule",
            str(LOGS / "beat-schedule.db"),
        ],
        LOGS / "celery-beat.log",
        db_url,
    )
    stack = [beat, worker, web]
    clients_procs: list[subprocess.Popen] = []
    me = os.getpid()
    groups = {
        "uvicorn master": lambda: [web.pid],
        "uvicorn worker": lambda: children(web.pid),
        "celery worker (main)": lambda: [worker.pid],
        "celery pool child": lambda: children(worker.pid),
        "celery beat": lambda: [beat.pid],
        "redis-server (shared, port of REDIS_URL)": lambda: listening(
            int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])
        ),
        "load client: http": lambda: [p.pid for p in clients_procs[1:2]],
        "load client: websockets": lambda: [p.pid for p in clients_procs[:1]],
        "this process": lambda: [me],
    }
    sampler = Sampler(groups)
    try:
        import requests

        wait_for(lambda: requests.get(f"{url}/healthz", timeout=2).ok, 60, 0.2, what="uvicorn")
        wait_for(lambda: len(children(worker.pid)) >= args.worker_concurrency, 60, 0.2, what="celery pool")
        sampler.start()
        plan_path, ready, stop_file = LOGS / "plan.json", LOGS / "ws-ready", LOGS / "ws-stop"
        plan = {
            "url": url,
            "clients": world["clients"],
            "ready_file": str(ready),
            "stop_file": str(stop_file),
            "ws_deadline": args.warmup + args.seconds + args.drain + 600,
        }
        (LOGS / "ws-plan.json").write_text(json.dumps(plan))
        ws_out, http_out = LOGS / "ws-out.json", LOGS / "http-out.json"
        ws = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "ws",
                "--plan",
                str(LOGS / "ws-plan.json"),
                "--out",
                str(ws_out),
            ],
            cwd=BASE,
            stdout=(LOGS / "ws-client.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        clients_procs.append(ws)
        connect_began = time.time()
        wait_for(lambda: ready.exists() or ws.poll() is not None, 300, 0.2, what="websocket clients")
        if ws.poll() is not None:
            raise RuntimeError(
                f"websocket client process failed: {(LOGS / 'ws-client.log').read_text()[-2000:]}"
            )
        print(
            f"{len(world['clients'])} websocket clients connected and subscribed in {time.time() - connect_began:.1f} s",
            flush=True,
        )
        t0 = time.time() + 2
        warm_end, end = t0 + args.warmup, t0 + args.warmup + args.seconds
        plan_http = {
            "url": url,
            "t0": t0,
            "end": end,
            "interval": args.interval,
            "fault_rate": args.fault_rate,
            "agents": world["agents"],
            "targets": world["targets"],
            "admin_token": world["admin_token"],
            "seed": args.seed,
            "connections": args.connections,
            "request_timeout": 30,
        }
        plan_path.write_text(json.dumps(plan_http))
        http = subprocess.Popen(
            [sys.executable, __file__, "--role", "http", "--plan", str(plan_path), "--out", str(http_out)],
            cwd=BASE,
            stdout=(LOGS / "http-client.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        clients_procs.append(http)
        print(
            f"load: {args.nodes} nodes every {args.interval:g} s ({args.nodes / args.interval:.0f} batches/s), "
            f"{args.fault_rate:g} faults/s, {len(world['clients'])} sockets; warm-up {args.warmup:g} s, "
            f"hold {args.seconds:g} s",
            flush=True,
        )
        http.wait(timeout=args.warmup + args.seconds + 120)
        if http.returncode:
            raise RuntimeError(f"HTTP client failed: {(LOGS / 'http-client.log').read_text()[-2000:]}")
        load_end = time.time()
        result = json.loads(http_out.read_text())
        fault_ids = [f[0] for f in result["faults"]]
        drained = drain(fault_ids, load_end + args.drain)
        time.sleep(2)
        stop_file.write_text("stop")
        ws.wait(timeout=60)
        sampler.stop.set()
        sampler.join(10)
        received = json.loads(ws_out.read_text())
        alive = {
            "celery beat": beat.poll() is None,
            "celery worker": worker.poll() is None,
            "uvicorn": web.poll() is None,
        }
        figures = report(args, world, result, received, sampler, (warm_end, end), drained, alive, load_before)
        verdict = verdict_of(figures, alive)
    finally:
        sampler.stop.set()
        for process in clients_procs:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
        for process in stack:
            stop_group(process)
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database()
    return 0 if verdict else 1


def scratch_database(connection_limit: int) -> str:
    """A fresh database owned by a role of its own whose connections are capped, so that the stack under load
    cannot take every connection of the PostgreSQL server it shares with others; Django set up and migrated."""
    import psycopg

    drop_database()
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{DB_NAME}" LOGIN CONNECTION LIMIT {int(connection_limit)}')
        conn.execute(f'CREATE DATABASE "{DB_NAME}" OWNER "{DB_NAME}"')
    url = PG.replace("://postgres@", f"://{DB_NAME}@") + f"/{DB_NAME}"
    os.environ.update(DATABASE_URL=url, REDIS_URL=REDIS_URL)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url


def drop_database() -> None:
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        conn.execute(f'DROP ROLE IF EXISTS "{DB_NAME}"')


def drain(fault_ids: list[int], deadline: float) -> dict:
    """Wait (bounded) until every fault has an action and every event has been relayed."""
    from controlplane.models import Event
    from jobs.models import RecoveryAction

    while True:
        decided = RecoveryAction.objects.filter(fault_id__in=fault_ids).values("fault_id").distinct().count()
        unsent = Event.objects.filter(sent_at__isnull=True).count()
        if (decided >= len(fault_ids) and not unsent) or time.time() > deadline:
            return {"decided": decided, "faults": len(fault_ids), "unsent": unsent}
        time.sleep(0.5)


def window_stats(result: dict, window: tuple[float, float]) -> dict:
    stats = {}
    for kind in ("telemetry", "fault"):
        rows = [r for r in result["records"] if r[0] == kind and window[0] <= r[1] < window[1]]
        ok = [r for r in rows if isinstance(r[4], int) and 200 <= r[4] < 300]
        statuses = collections.Counter(
            str(r[4]) for r in rows if not (isinstance(r[4], int) and 200 <= r[4] < 300)
        )
        late = [r for r in rows if r[2] - r[1] > 0.1]
        span = window[1] - window[0]
        stats[kind] = {
            "n": len(rows),
            "ok": len(ok),
            "errors": dict(statuses),
            "offered": len(rows) / span,
            "achieved": len(ok) / span,
            "p50": pct([(r[3] - r[2]) * 1000 for r in ok], 50),
            "p99": pct([(r[3] - r[2]) * 1000 for r in ok], 99),
            "max": max(((r[3] - r[2]) * 1000 for r in ok), default=float("nan")),
            "late": len(late),
        }
    return stats


def losses(received: dict, end: float) -> dict:
    """Events the database holds for each client's topics, created after it subscribed and before the load
    ended, against what it received live, and live or through catch-up."""
    from controlplane.models import Event

    topics = {t for c in received["clients"] for t in c["topics"]}
    earliest = min(c["subscribed_at"] for c in received["clients"] if c["subscribed_at"])
    held = collections.defaultdict(list)
    for topic, seq, created in Event.objects.filter(
        topic__in=topics,
        created_at__gte=datetime.fromtimestamp(earliest).astimezone(),
        created_at__lt=datetime.fromtimestamp(end).astimezone(),
    ).values_list("topic", "seq", "created_at"):
        held[topic].append((seq, created.timestamp()))
    expected = missed_live = lost = 0
    worst = []
    for client in received["clients"]:
        for topic in client["topics"]:
            want = {seq for seq, created in held[topic] if created >= client["subscribed_at"]}
            live = set(client["live"].get(topic, []))
            got = live | set(client["caught_up"].get(topic, []))
            expected += len(want)
            missed_live += len(want - live)
            lost += len(want - got)
            if want - got:
                worst.append((len(want - got), client["name"], topic))
    return {
        "expected": expected,
        "missed_live": missed_live,
        "lost": lost,
        "worst": sorted(worst, reverse=True)[:5],
        "reconnects": sum(c["reconnects"] for c in received["clients"]),
        "duplicates": sum(c["duplicates"] for c in received["clients"]),
        "refused": sum(len(c["refused"]) for c in received["clients"]),
    }


def decision_breakdown(fault_ids: list[int]) -> dict:
    """From the database: fault received → action planned (queueing in Celery and the decision)."""
    from jobs.models import RecoveryAction

    values = [
        (a.planned_at - a.fault.received_at).total_seconds() * 1000
        for a in RecoveryAction.objects.filter(fault_id__in=fault_ids).select_related("fault")
    ]
    return {"p50": pct(values, 50), "p99": pct(values, 99), "n": len(values)}


def report(args, world, result, received, sampler, window, drained, alive, load_before) -> None:
    stats = window_stats(result, window)
    sent = {f[0]: f[2] for f in result["faults"] if window[0] <= f[1] < window[1]}
    first = {int(k): v for k, v in received["first_action"].items()}
    decided = [(first[f] - t) * 1000 for f, t in sent.items() if f in first]
    delays = {
        kind: [d * 1000 for created, d in rows if window[0] <= created < window[1]]
        for kind, rows in received["delays"].items()
    }
    lost = losses(received, window[1])
    breakdown = decision_breakdown(list(sent))
    span = window[1] - window[0]
    print()
    print(
        f"=== Load (issue 9): {args.nodes} nodes × 1 batch / {args.interval:g} s, {len(world['clients'])} websocket "
        f"clients, {args.fault_rate:g} faults/s; hold {args.seconds:g} s after {args.warmup:g} s warm-up ==="
    )
    print(
        f"stack: uvicorn --workers {args.web_workers} {args.web_args}, celery worker --concurrency {args.worker_concurrency}, beat; "
        f"PostgreSQL (the bench role capped at {args.db_connection_limit} connections) and Redis on 127.0.0.1, "
        f"both shared with other users of this machine"
    )
    print()
    print(
        f"{'':34} {'offered':>9} {'achieved':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}  non-2xx / failures"
    )
    for kind, label in (("telemetry", "POST /api/v1/ingest/telemetry/"), ("fault", "POST /api/v1/faults/")):
        s = stats[kind]
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())) or "none"
        print(
            f"{label:34} {s['offered']:7.1f}/s {s['achieved']:7.1f}/s {s['p50']:9.1f} {s['p99']:9.1f} "
            f"{s['max']:9.1f}  {errors}" + (f"  ({s['late']} sent >100 ms late)" if s["late"] else "")
        )
    print(
        f"{'fault → decision (fleet socket)':34} {len(sent) / span:7.1f}/s {len(decided) / span:7.1f}/s "
        f"{pct(decided, 50):9.1f} {pct(decided, 99):9.1f} {max(decided, default=float('nan')):9.1f}  "
        f"{len(sent) - len(decided)} of {len(sent)} without a decision heard"
    )
    print(
        f"{'  of which received → planned (db)':34} {'':9} {'':9} {breakdown['p50']:9.1f} {breakdown['p99']:9.1f}"
    )
    for kind, label in (("fleet", "websocket delivery, fleet"), ("job", "websocket delivery, job-<id>")):
        values = delays[kind]
        print(
            f"{label:34} {'':9} {len(values) / span:7.0f}/s {pct(values, 50):9.1f} {pct(values, 99):9.1f} "
            f"{max(values, default=float('nan')):9.1f}  ({len(values)} deliveries)"
        )
    print(
        f"events: {lost['expected']} due to subscribed clients, {lost['missed_live']} not delivered live, "
        f"{lost['lost']} lost after catch-up; {lost['reconnects']} reconnects, {lost['duplicates']} duplicates, "
        f"{lost['refused']} subscriptions refused" + (f"; worst {lost['worst']}" if lost["worst"] else "")
    )
    print(
        f"after the load: {drained['decided']} of {drained['faults']} faults decided, {drained['unsent']} events "
        f"unsent in the outbox; websocket client loop lag p99 {received['lag_p99_ms']:.1f} ms, "
        f"max {received['lag_max_ms']:.1f} ms"
    )
    if result["errors_seen"]:
        print("first failures:", *list(dict.fromkeys(result["errors_seen"]))[:5], sep="\n  ")
    print()
    print(
        f"{'process':52} {'RSS peak':>9} {'PSS peak':>9} {'USS peak':>9} {'RSS end':>9} {'PSS end':>9} "
        f"{'threads':>7} "
        f"{'cores':>6}   (MiB; cores = CPU share over the hold)"
    )
    for name, peak, last, cores, gone in summarise_processes(sampler.samples, window):
        print(
            f"{name[:52]:52} {mib(peak['rss'])}  {mib(peak['pss'])}  {mib(peak['uss'])}  {mib(last['rss'])}  "
            f"{mib(last['pss'])}  {peak['threads']:7d}  {cores:6.2f}"
            + ("   (gone at the end)" if gone else "")
        )
    inside = [s for s in sampler.samples if window[0] <= s["t"] <= window[1]]
    if len(inside) > 1:
        busy = (inside[-1]["machine"][0] - inside[0]["machine"][0]) / (inside[-1]["t"] - inside[0]["t"])
        print(f"whole machine: {busy:.2f} of {os.cpu_count()} cores busy during the hold")
        if inside[0].get("postgres_cpu") is not None and inside[-1].get("postgres_cpu") is not None:
            pg = (inside[-1]["postgres_cpu"] - inside[0]["postgres_cpu"]) / (inside[-1]["t"] - inside[0]["t"])
            print(f"PostgreSQL server, every database and every backend (exited ones too): {pg:.2f} cores")
        queue = [s["celery_queue"] for s in inside if s["celery_queue"] is not None]
        used = [s["redis_used"] for s in inside if s["redis_used"] is not None]
        if queue:
            print(f"celery queue length during the hold: max {max(queue)}, at the end {queue[-1]}")
        if used:
            print(f"redis used_memory (whole server): peak {max(used) / 2**20:.1f} MiB")
        loads = [s["load"] for s in inside]
        print(
            f"load average (1 min) during the hold: {min(loads):.2f} – {max(loads):.2f}; before the run "
            f"{load_before[0]:.2f}; now {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)"
        )
    held = collections.defaultdict(int)
    for sample in inside or sampler.samples:
        for label, pid in sample["procs"]:
            if not label.startswith(("postgres", "redis")) and sample.get("pg_sockets", {}).get(pid):
                held[label] = max(held[label], sample["pg_sockets"][pid])
    counts = [sum(s["backends"].values()) for s in inside if "backends" in s]
    sessions = [s["sessions"] for s in inside if s.get("sessions") is not None]
    if counts:
        print(
            f"PostgreSQL connections to the bench db: {min(counts)} – {max(counts)} open during the hold; "
            + (
                f"{sessions[-1] - sessions[0]} new sessions in {inside[-1]['t'] - inside[0]['t']:.0f} s "
                f"({(sessions[-1] - sessions[0]) / max(1, inside[-1]['t'] - inside[0]['t']):.1f}/s); "
                if sessions
                else ""
            )
            + "most held at once by one process: "
            + ", ".join(f"{k} {v}" for k, v in sorted(held.items()))
        )
    total = sum(sampler.waits.values())
    if total:
        print(
            "PostgreSQL backends of the bench db, not idle, per sample: "
            + ", ".join(f"{k} {v * 100 / total:.0f}%" for k, v in sampler.waits.most_common(6))
        )
        print(
            "  most often active: " + "; ".join(f"{v}× {k}" for k, v in sampler.active_queries.most_common(4))
        )
    for name, running in alive.items():
        if not running:
            print(f"!! {name} exited during the run (see {LOGS})")
    for log in sorted(LOGS.glob("*.log")):
        text = log.read_text(errors="replace")
        bad = [
            line for line in text.splitlines() if "Traceback" in line or "ERROR" in line or "CRITICAL" in line
        ]
        if bad:
            print(f"{log.name}: {len(bad)} error lines, e.g. {bad[0][:200]!r}")
    return {"stats": stats, "lost": lost, "decided": decided, "sent": sent}


def verdict_of(figures: dict, alive: dict) -> bool:
    stats, lost = figures["stats"], figures["lost"]
    problems = []
    for kind in ("telemetry", "fault"):
        s = stats[kind]
        if s["errors"]:
            problems.append(f"{kind}: {sum(s['errors'].values())} failed requests")
        if s["achieved"] < 0.95 * s["offered"]:
            problems.append(f"{kind}: {s['achieved']:.1f}/s of {s['offered']:.1f}/s answered")
    if len(figures["decided"]) < len(figures["sent"]):
        problems.append(f"{len(figures['sent']) - len(figures['decided'])} faults without a decision heard")
    if lost["lost"]:
        problems.append(f"{lost['lost']} events lost")
    if not all(alive.values()):
        problems.append("a stack process died")
    print()
    print(
        "VERDICT: "
        + (
            "HELD — every request answered, every fault decided, no event lost"
            if not problems
            else "FELL OVER — " + "; ".join(problems)
        )
    )
    return not problems


if __name__ == "__main__":
    sys.exit(main())
