"""Benchmark: fault storms, the intake shapes a real one has, with the real stack.

Two storms, one after the other, each on a protected simulated cluster of its own with fewer spare nodes than jobs:

1. *a leaf switch fails*: 64 nodes under one leaf, 16 jobs of 4 nodes (32 GPUs each); every node's agent reports
   its 8 NICs down in its next batch, the 64 batches (512 NIC reports) within one second;
2. *64 nodes die at once*: 64 one-node jobs (8 GPUs each); each node's agent reports Xid 79 on GPU 0 in its batch,
   the 64 batches within one second, and Alertmanager sends one grouped NodeDown webhook of all 64 nodes in the
   middle of that second.

It builds its own world (a scratch PostgreSQL database, dropped at the end; Redis ``BENCH_REDIS_URL``, flushed),
starts uvicorn (2 workers), a Celery worker (concurrency 2) and beat, as bench/fault_latency.py does, and a
websocket client subscribed to ``fleet``. Each node first sends a healthy batch (not timed). For each storm it
prints one line: the time from the moment the last report was sent until every fault of the storm has its decision
and that decision's event reached the websocket client (``decided in N.NN s``), the same from the first report, when
the last report was answered, whether every ``fleet`` event up to the last one received arrived, the number of decisions (one ``fault_handle`` run deciding a batch of faults), of faults and actions, the SQL statements the
server processes sent for it (bench/querycount.py), and two checks: no spare booked twice, no migration budget
exceeded. Under each storm's line: the CPU per fault that web, worker, beat and PostgreSQL spent from its first report
until its last decision was received; at the end, that figure as a multiple of the CPU reference (bench/reference.py).
It exits 0 whatever the figures. Goal: every storm decided within 2 s of the last report.

    .venv/bin/python bench/fault_storm.py
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import NodeAgent  # noqa: E402
from procstat import cpu_by_pid, cpu_used_since, group_cpu, named  # noqa: E402
from querycount import KEY as QUERY_KEY  # noqa: E402
from querycount import SHAPES as QUERY_SHAPES  # noqa: E402
from reference import cpu_reference_samples, reference_of  # noqa: E402

DB_NAME = os.environ.get("BENCH_DATABASE_NAME", "lockstep_bench_storm")
ADMIN_URL = os.environ.get("BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
DB_URL = ADMIN_URL.rsplit("/", 1)[0] + f"/{DB_NAME}"
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
NODES, NICS, GPUS = 64, 8, 8
GOAL_SECONDS = 2.0
WAIT_SECONDS = 60.0


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


def build_cluster(fleet, tenant, version, *, name: str, jobs: int, nodes_per_job: int, spares: int, leaf_of):
    """A protected simulated cluster: ``jobs`` jobs of ``nodes_per_job`` nodes, ``spares`` spare nodes on other
    leaves; returns (cluster, agent token, working hostnames)."""
    from django.utils import timezone

    from fleet.choices import HealthStatus, NodeState, SyncStatus
    from fleet.models import GPU, NIC, Cluster, Node, ObservedAddon
    from jobs.models import Job, JobAllocation
    from telemetry.services.tokens import agent_token_create

    now = timezone.now()
    cluster = Cluster.objects.create(
        fleet=fleet,
        name=name,
        blueprint=version.blueprint,
        blueprint_version=version,
        connection={"nic_failover_seconds": 1, "migration_pause_seconds": 30},
    )
    for addon in ("nic-failover", "live-migration"):
        ObservedAddon.objects.create(
            cluster=cluster, name=addon, sync=SyncStatus.IN_SYNC, health=HealthStatus.HEALTHY, observed_at=now
        )
    working = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"{name}-{i:03d}",
                gpu_model="H100",
                leaf_switch=leaf_of(i),
                rack=f"rack-{i // 32}",
                state=NodeState.READY,
            )
            for i in range(jobs * nodes_per_job)
        ]
    )
    spare = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"{name}-spare-{i}",
                gpu_model="H100",
                leaf_switch=f"leaf-spare-{i % 4}",
                rack="rack-spare",
                state=NodeState.SPARE,
            )
            for i in range(spares)
        ]
    )
    GPU.objects.bulk_create(
        [
            GPU(node=n, index=g, uuid=f"GPU-{n.hostname}-{g}", model="H100")
            for n in working + spare
            for g in range(GPUS)
        ]
    )
    NIC.objects.bulk_create(
        [NIC(node=n, name=f"mlx5_{r}", rail=r) for n in working + spare for r in range(NICS)]
    )
    rows = Job.objects.bulk_create(
        [
            Job(
                tenant=tenant,
                cluster=cluster,
                name=f"{name}-job-{j}",
                gpus=GPUS * nodes_per_job,
                state="Running",
                checkpoint_interval=10**9,
                iteration_at=now,
                started_at=now,
            )
            for j in range(jobs)
        ]
    )
    JobAllocation.objects.bulk_create(
        [
            JobAllocation(
                job=rows[i // nodes_per_job],
                node=n,
                gpu_indices=list(range(GPUS)),
                rank_start=(i % nodes_per_job) * GPUS,
                rank_end=(i % nodes_per_job) * GPUS + GPUS - 1,
            )
            for i, n in enumerate(working)
        ]
    )
    _, token = agent_token_create(actor=None, cluster=cluster, name="storm")
    return cluster, token, [n.hostname for n in working]


def build_world():
    """A provider operator's token, and the two storms' clusters."""
    from django.contrib.auth import get_user_model

    from fleet.models import Blueprint, BlueprintVersion, Fleet
    from tenancy.models import Membership, Tenant
    from tenancy.services import token_create

    user = get_user_model().objects.create_user("storm-operator", password="x" * 20)
    Membership.objects.create(user=user, role="operator")
    _, token = token_create(actor=user, owner=user, name="storm", scope="write")
    tenant = Tenant.objects.create(name="Storm", slug="storm")
    blueprint = Blueprint.objects.create(name="storm", auto_rollout=False)
    version = BlueprintVersion.objects.create(
        blueprint=blueprint,
        number=1,
        state="active",
        policy={"protection": {"nic_failover": True, "live_migration": True}},
    )
    fleet = Fleet.objects.create(name="storm", max_cordoned_nodes=10_000, max_draining_nodes=10_000)
    leaf = build_cluster(
        fleet, tenant, version, name="leaf", jobs=16, nodes_per_job=4, spares=8, leaf_of=lambda i: "leaf-0"
    )
    dead = build_cluster(
        fleet,
        tenant,
        version,
        name="dead",
        jobs=64,
        nodes_per_job=1,
        spares=16,
        leaf_of=lambda i: f"leaf-{i // 16}",
    )
    # A fleet in service has its tables' statistics (autovacuum's ANALYZE); a world built a moment ago does not, and
    # the hot reads are prepared statements whose generic plans follow those statistics (docs/benchmarks.md).
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return token, leaf, dead


class Listener(threading.Thread):
    """A websocket client subscribed to ``fleet``: when each fault's decision arrived (the first action event
    carrying it, or its fault.handled event), and the sequence numbers received."""

    def __init__(self, port: int, token: str):
        super().__init__(daemon=True)
        from websockets.sync.client import connect

        self.decided: dict[int, float] = {}
        self.seqs: list[int] = []
        self.stop = threading.Event()
        self.ws = connect(
            f"ws://127.0.0.1:{port}/ws/events/",
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=10,
            max_size=None,
            ping_interval=None,
        )
        json.loads(self.ws.recv(timeout=10))
        self.ws.send(json.dumps({"subscribe": ["fleet"]}))
        json.loads(self.ws.recv(timeout=10))

    def run(self):
        while not self.stop.is_set():
            try:
                raw = self.ws.recv(timeout=0.5)
            except TimeoutError:
                continue
            except Exception:
                return
            now, message = time.perf_counter(), json.loads(raw)
            if message.get("type") != "event":
                continue
            self.seqs.append(message["seq"])
            kind, payload = message["kind"], message["payload"]
            if kind == "actions.decided" or kind.startswith("action."):
                ids = [a.get("fault") for a in payload.get("actions") or [payload]]
            elif kind == "fault.handled":
                ids = [payload.get("fault")]
            else:
                ids = []
            for fault in ids:
                if fault is not None:
                    self.decided.setdefault(fault, now)


def post_all(
    url: str, sends: list[tuple[float, str, str, bytes]], threads: int | None = None
) -> tuple[float, float, float, list[str]]:
    """POST each (due, path, token, body) at its due time (perf_counter), one thread per report unless ``threads``
    says fewer (so a slow answer delays no other report, as with real agents); returns the first send, the last
    send, the last answer, and the failures."""
    import queue

    import requests

    work: queue.Queue = queue.Queue()
    for item in sorted(sends):
        work.put(item)
    first, last_sent, last, errors = [float("inf")], [0.0], [0.0], []
    lock = threading.Lock()

    def sender():
        session = requests.Session()
        while True:
            try:
                due, path, token, body = work.get_nowait()
            except queue.Empty:
                return
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            began = time.perf_counter()
            response = session.post(
                f"{url}{path}",
                data=body,
                timeout=60,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with lock:
                first[0], last_sent[0], last[0] = (
                    min(first[0], began),
                    max(last_sent[0], began),
                    max(last[0], time.perf_counter()),
                )
                if response.status_code not in (200, 201):
                    errors.append(f"{path} {response.status_code} {response.text[:200]}")

    pool = [threading.Thread(target=sender) for _ in range(threads or len(sends))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return first[0], last_sent[0], last[0], errors


def batch(
    agent: NodeAgent, *, nics_down: bool = False, xid: int | None = None, link_downed: int = 0
) -> bytes:
    body = agent.batch()
    for nic in body["nics"]:
        nic["fields"]["link_downed"] = link_downed
        if nics_down:
            nic.update(link_state="down", ib_state="DOWN", ib_phys_state="Disabled")
    if xid is not None:
        body["events"] = [
            {"ts": body["sent_at"], "type": "xid", "xid": xid, "gpu": 0, "uuid": f"GPU-{agent.hostname}-0"}
        ]
    return json.dumps(body).encode()


def node_down_webhook(hostnames: list[str]) -> bytes:
    from datetime import UTC, datetime

    starts = datetime.now(UTC).isoformat()
    alerts = [
        {
            "status": "firing",
            "labels": {"alertname": "NodeDown", "instance": f"{h}:9100", "severity": "critical"},
            "annotations": {"summary": f"{h} is not answering"},
            "startsAt": starts,
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": f"nodedown-{h}",
        }
        for h in hostnames
    ]
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}:{alertname="NodeDown"}',
            "status": "firing",
            "receiver": "lockstep",
            "groupLabels": {"alertname": "NodeDown"},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "truncatedAlerts": 0,
            "alerts": alerts,
        }
    ).encode()


def queries() -> int:
    import redis

    return int(redis.Redis.from_url(REDIS_URL).get(QUERY_KEY) or 0)


def query_shapes(top: int = 30) -> list[tuple[int, str]]:
    """The statements' shapes counted since the last call, most frequent first (``BENCH_QUERY_SHAPES=1``)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    counts = sorted(
        ((int(n), shape.decode()) for shape, n in client.hgetall(QUERY_SHAPES).items()), reverse=True
    )
    client.delete(QUERY_SHAPES)
    return counts[:top]


def cpu_now(groups: dict[str, int]) -> tuple[dict[str, float], dict[int, float]]:
    """CPU seconds so far of each process group (web, worker, beat), and of each PostgreSQL process by pid."""
    return {name: group_cpu(pgid) for name, pgid in groups.items()}, cpu_by_pid(named("postgres"))


def cpu_spent(groups: dict[str, int], before: tuple[dict[str, float], dict[int, float]]) -> dict[str, float]:
    """CPU seconds each group and PostgreSQL spent since ``before`` (``cpu_now``); a backend that exited meanwhile
    is left out rather than subtracted."""
    spent = {name: group_cpu(pgid) - before[0][name] for name, pgid in groups.items()}
    spent["postgres"] = cpu_used_since(before[1], "postgres")
    return spent


def storm(
    name: str, url: str, listener: Listener, cluster, sends, started_at, groups: dict[str, int]
) -> dict:
    """Send one storm and wait for its decisions; returns what it measured, with the CPU the processes spent from
    the first report until the last decision was received, per fault."""
    from django.db.models import Count, Q

    from controlplane.models import TopicSequence
    from jobs.choices import BUDGETED_KINDS, ActionState, FaultState
    from jobs.models import FaultEvent, RecoveryAction, SpareBooking

    def fleet_seq() -> int:
        return TopicSequence.objects.filter(topic="fleet").values_list("last_seq", flat=True).first() or 0

    before, seq_before = queries(), fleet_seq()
    query_shapes()
    cpu_before = cpu_now(groups)
    first, last_sent, last, errors = post_all(url, sends)
    faults = list(
        FaultEvent.objects.filter(cluster=cluster, received_at__gte=started_at).values_list("pk", flat=True)
    )
    deadline = time.perf_counter() + WAIT_SECONDS
    while time.perf_counter() < deadline and not all(f in listener.decided for f in faults):
        time.sleep(0.05)
    spent = cpu_spent(groups, cpu_before)
    arrived = [listener.decided[f] for f in faults if f in listener.decided]
    done = max(arrived) if arrived else float("nan")
    time.sleep(0.5)  # the last counts reach Redis (querycount flushes every 0.1 s)
    statements = queries() - before
    shapes = query_shapes() if os.environ.get("BENCH_QUERY_SHAPES") else []
    # Every event on ``fleet`` up to the last one received (the decisions' and everything published meanwhile).
    received = {seq for seq in listener.seqs if seq > seq_before}
    gaps = (max(received) - seq_before - len(received)) if received else fleet_seq() - seq_before
    rows = FaultEvent.objects.filter(pk__in=faults)
    undecided = rows.filter(state=FaultState.NEW).count()
    decisions = rows.exclude(handled_at=None).values("handled_at").distinct().count()
    actions = RecoveryAction.objects.filter(fault_id__in=faults)
    kinds = Counter(actions.values_list("kind", flat=True))
    twice = (
        SpareBooking.objects.filter(released_at__isnull=True, action__cluster=cluster)
        .values("node_id", "gpu_index")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    whole_and_gpu = (
        SpareBooking.objects.filter(released_at__isnull=True, action__cluster=cluster)
        .values("node_id")
        .annotate(whole=Count("id", filter=Q(whole_node=True)), n=Count("id"))
        .filter(whole__gte=1, n__gt=1)
        .count()
    )
    running = RecoveryAction.objects.filter(
        cluster=cluster, kind__in=BUDGETED_KINDS, dry_run=False, state=ActionState.RUNNING
    )
    per_leaf = Counter(running.values_list("to_node__leaf_switch", flat=True))
    over = running.count() > cluster.max_concurrent_migrations or any(
        n > cluster.max_migrations_per_leaf for n in per_leaf.values()
    )
    reports = len(sends)
    return {
        "name": name,
        "reports": reports,
        "faults": len(faults),
        "undecided": undecided,
        "unseen": len(faults) - len(arrived),
        "after_last": done - last_sent,
        "after_first": done - first,
        "answered": last - last_sent,
        "events": len(received),
        "gaps": gaps,
        "decisions": decisions,
        "actions": sum(kinds.values()),
        "kinds": dict(kinds),
        "queries": statements,
        "spare_twice": twice + whole_and_gpu,
        "budget_exceeded": over,
        "errors": errors,
        "running_migrations": running.count(),
        "per_leaf": dict(per_leaf),
        "shapes": shapes,
        "cpu": {name: seconds / max(1, len(faults)) for name, seconds in spent.items()},
    }


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        DATABASE_URL=DB_URL,
        REDIS_URL=REDIS_URL,
        PYTHONUNBUFFERED="1",
        LOG_LEVEL="WARNING",
        BENCH_QUERYCOUNT_CELERY="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def report(result: dict) -> None:
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(result["kinds"].items()))
    missing = "none missing" if not result["gaps"] else f"{result['gaps']} MISSING"
    print(
        f"{result['name']}: decided in {result['after_last']:.2f} s after the last report was sent "
        f"({result['after_first']:.2f} s from the first; the last answered {result['answered']:.2f} s after it was "
        f"sent); {result['reports']} reports, {result['faults']} faults, "
        f"{result['decisions']} decisions, {result['actions']} actions ({kinds}), {result['queries']} queries; "
        f"{'no spare booked twice' if not result['spare_twice'] else str(result['spare_twice']) + ' spares booked twice'}; "
        f"{'no budget exceeded' if not result['budget_exceeded'] else 'BUDGET EXCEEDED'} "
        f"({result['running_migrations']} migrations running); {result['events']} fleet events received, "
        f"{missing}; "
        f"{'within' if result['after_last'] <= GOAL_SECONDS else 'NOT within'} {GOAL_SECONDS:.0f} s",
        flush=True,
    )
    cpu = result["cpu"]
    print(
        f"  CPU per fault {1000 * sum(cpu.values()):.1f} ms "
        f"({', '.join(f'{name} {1000 * cpu[name]:.1f}' for name in ('web', 'worker', 'postgres', 'beat'))}), "
        f"from the first report until the last decision was received",
        flush=True,
    )
    if result["undecided"] or result["unseen"]:
        print(f"  {result['undecided']} faults still new, {result['unseen']} decisions not received")
    if result["errors"]:
        print(f"  {len(result['errors'])} reports failed, e.g. {result['errors'][0]}")
    for n, shape in result["shapes"]:
        print(f"  {n:6d}  {shape}")


def main() -> int:
    from django.utils import timezone

    scratch_database()
    setup_django()
    token, (leaf, leaf_token, leaf_hosts), (dead, dead_token, dead_hosts) = build_world()
    from tests.support.processes import free_port, stop_group, wait_for

    port = free_port()
    logs = Path(os.environ.get("BENCH_LOG_DIR", "/tmp"))
    venv = Path(sys.executable).parent
    web = start(
        [
            str(venv / "uvicorn"),
            "--factory",
            "querycount:asgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--workers",
            "2",
        ],
        logs / "storm-uvicorn.log",
    )
    worker = start(
        [
            str(venv / "celery"),
            "-A",
            "querycount:celery",
            "worker",
            "--loglevel=warning",
            "--concurrency=2",
            "-n",
            f"storm-{port}@%h",
            "--without-gossip",
            "--without-mingle",
        ],
        logs / "storm-celery.log",
    )
    beat = start(
        [
            str(venv / "celery"),
            "-A",
            "querycount:celery",
            "beat",
            "--loglevel=warning",
            "--schedule",
            str(logs / f"storm-beat-{port}.db"),
        ],
        logs / "storm-beat.log",
    )
    results = []
    groups = {
        "web": web.pid,
        "worker": worker.pid,
        "beat": beat.pid,
    }  # each its own session and process group
    try:
        import requests

        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok, 60, what="uvicorn")
        listener = Listener(port, token)
        listener.start()
        url = f"http://127.0.0.1:{port}"
        rng = random.Random(7)
        agents = {h: NodeAgent(h, rng) for h in leaf_hosts + dead_hosts}
        path = "/api/v1/ingest/telemetry/"
        tokens = {h: leaf_token for h in leaf_hosts} | {h: dead_token for h in dead_hosts}
        # Every node's healthy batch first (the NICs' previous state), twice, not timed.
        for _ in range(2):
            now = time.perf_counter()
            *_, errors = post_all(
                url,
                [(now + i / 100, path, tokens[h], batch(agents[h])) for i, h in enumerate(agents)],
                threads=16,
            )
            if errors:
                print(f"healthy batches failed: {errors[0]}")
                return 0
        time.sleep(3)

        started_at, t0 = timezone.now(), time.perf_counter() + 0.2
        sends = [
            (t0 + i / NODES, path, leaf_token, batch(agents[h], nics_down=True, link_downed=1))
            for i, h in enumerate(leaf_hosts)
        ]
        results.append(
            storm(
                f"leaf switch down ({NODES} nodes, {NODES * NICS} NIC reports)",
                url,
                listener,
                leaf,
                sends,
                started_at,
                groups,
            )
        )
        report(results[-1])
        time.sleep(5)

        started_at, t0 = timezone.now(), time.perf_counter() + 0.2
        sends = [
            (t0 + i / NODES, path, dead_token, batch(agents[h], xid=79)) for i, h in enumerate(dead_hosts)
        ]
        sends.append((t0 + 0.5, "/api/v1/ingest/alertmanager/", token, node_down_webhook(dead_hosts)))
        results.append(
            storm(
                f"{NODES} nodes dead (Xid 79 in {NODES} agent batches, one NodeDown webhook of {NODES})",
                url,
                listener,
                dead,
                sends,
                started_at,
                groups,
            )
        )
        report(results[-1])
        listener.stop.set()
    finally:
        for process in (beat, worker, web):
            stop_group(process, 15)
        from django.db import connections

        connections.close_all()
        if not os.environ.get("BENCH_KEEP"):
            scratch_database(drop_only=True)
    reference = reference_of(cpu_reference_samples(10))
    print(
        f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
        f"CPU reference: sum(range(10**6)) in {reference['wall']:.1f} ms (median of 10 samples after the storms; "
        f"as CPU time {reference['low']:.1f}–{reference['high']:.1f} ms)"
    )
    if results:
        print(
            "CPU per fault as a multiple of the reference (as CPU time): "
            + ", ".join(f"{1000 * sum(r['cpu'].values()) / reference['cpu']:.2f}×" for r in results)
            + f" ({reference['cpu']:.1f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
