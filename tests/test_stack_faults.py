"""Faults of the stack (issue #9), with real processes: Redis restarted in the middle of a fault storm, PostgreSQL
stopped and started while the workers, beat and a rollout run, and a worker SIGKILLed mid-decision and between its
commit and the relay of its events.

Afterwards every reported fault has exactly one outcome (handled or ignored, at most one recovery action per fault
and job, every action finished), every rollout is in a consistent state, and a websocket client that does what
static/js/live.js does in a browser (catch up from /api/v1/events/ after it (re)subscribes and whenever a topic's
sequence jumps) holds every event of its topics, exactly the ones in the database. Each test prints how many faults
were injected and lost (none may be) and how long the stack took to recover.
"""

import json
import signal
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import psycopg
import pytest
import requests
from django.db import connection, transaction
from django.db.models import Count
from websockets.sync.client import connect

from controlplane.access import Role
from controlplane.models import AuditEntry, Event
from controlplane.selectors import topic_seq
from fleet.choices import RolloutClusterStatus, RolloutState
from fleet.models import Rollout, RolloutBatch, SimulatedAddon, SimulatedOperation
from fleet.services.blueprints import version_create
from fleet.services.rollouts import rollout_start
from jobs.choices import ActionState, FaultState
from jobs.models import FaultEvent, RecoveryAction
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_tenant, make_user, token_header
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import (
    PrivatePostgres,
    PrivatePostgresUnavailable,
    PrivateRedis,
    celery_beat,
    celery_worker,
    database_url,
    kill_group,
    lock_waiters,
    uvicorn_server,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Beat at test speed: the sweeps (faults, outbox), recovery steps and rollout ticks every second.
FAST = {
    "HEARTBEAT_SECONDS": 1,
    "RECOVERY_ADVANCE_SECONDS": 1,
    "FAULT_SWEEP_SECONDS": 1,
    "OUTBOX_SWEEP_SECONDS": 1,
    "ROLLOUT_TICK_SECONDS": 1,
}
CLOSED = (FaultState.HANDLED, FaultState.IGNORED)
FINISHED = (ActionState.SUCCEEDED, ActionState.FAILED)


class LiveClient(threading.Thread):
    """A websocket client that follows static/js/live.js: on (re)connect it subscribes to its topics and catches
    each up from ``/api/v1/events/?topic=…&after=<last seq>``; an event whose sequence number jumps is queued and
    the topic caught up; duplicates are dropped; a closed socket is reopened after 0.5 s, doubling. A catch-up
    that fails is retried after 0.5 s, doubling (live.js: 1 s, up to 30 s), and queued events are applied only
    while they follow on; a topic whose announced head (the subscribe reply's and the consumer's ``heads``) is
    above the last event applied is caught up. ``seen`` maps (topic, seq) to how the event came: "live" over the
    socket or "catch-up" from the API."""

    def __init__(self, port: int, token: str, topics: list[str]):
        super().__init__(daemon=True)
        self.base, self.token = f"http://127.0.0.1:{port}", token
        self.url = f"ws://127.0.0.1:{port}/ws/events/"
        # What the page rendered from the database: each topic's last sequence number.
        self.start_seq = {name: topic_seq(name) for name in topics}
        self.last = dict(self.start_seq)
        self.queue: dict[str, list[dict]] = defaultdict(list)
        self.seen: dict[tuple[str, int], tuple[str, str]] = {}
        self.opened = self.gaps = self.failed_catch_ups = 0
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def run(self):
        backoff = 0.5
        while not self.stop.is_set():
            try:
                with connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=5,
                    max_size=None,
                ) as ws:
                    self.opened += 1
                    backoff = 0.5
                    self._listen(ws)
            except Exception:  # refused, or the socket closed (or broke): reopen it, as the browser does
                pass
            if not self.stop.is_set():
                time.sleep(backoff)
                backoff = min(backoff * 2, 10)

    def _listen(self, ws):
        ws.send(json.dumps({"subscribe": list(self.last)}))
        while not self.stop.is_set():
            try:
                data = json.loads(ws.recv(timeout=0.2))
            except TimeoutError:
                continue
            if data.get("type") == "subscribed":
                for name in data["topics"]:
                    self.catch_up(name)
                self.subscribed.set()
            elif data.get("type") == "heads":
                for name, head in data["heads"].items():
                    if name in self.last and head > self.last[name]:
                        self.gaps += 1
                        self.catch_up(name)
            elif data.get("type") == "event":
                self.receive(data)

    def receive(self, event: dict) -> None:
        name = event["topic"]
        if name not in self.last:
            return
        if event["seq"] > self.last[name] + 1:
            self.gaps += 1
            self.queue[name].append(event)
            self.catch_up(name)
            return
        self.apply(name, event, "live")

    def apply(self, name: str, event: dict, how: str) -> None:
        if event["seq"] <= self.last[name]:
            return  # a duplicate, or already caught up
        self.last[name] = event["seq"]
        self.seen[(name, event["seq"])] = (how, event["kind"])

    def catch_up(self, name: str) -> None:
        backoff = 0.5
        while not self.stop.is_set():
            url = f"{self.base}/api/v1/events/?page_size=500&topic={name}&after={self.last[name]}"
            try:
                while url:
                    response = self.session.get(url, timeout=10)
                    response.raise_for_status()
                    body = response.json()
                    for event in body["results"]:
                        self.apply(name, event, "catch-up")
                    url = body.get("next")
                break
            except Exception:  # keep the queue and try again, as live.js does
                self.failed_catch_ups += 1
                time.sleep(backoff)
                backoff = min(backoff * 2, 8)
        waiting = sorted(self.queue.pop(name, []), key=lambda e: e["seq"])
        for index, event in enumerate(waiting):
            if event["seq"] > self.last[name] + 1:  # still a gap: wait for the next catch-up
                self.queue[name] = waiting[index:]
                return
            self.apply(name, event, "live")

    def close(self):
        self.stop.set()
        self.join(10)

    def expected(self) -> dict[tuple[str, int], str]:
        """Every event of the client's topics written since the page rendered, from the database: its kind."""
        found = {}
        for name, start in self.start_seq.items():
            found |= {
                (name, seq): kind
                for seq, kind in Event.objects.filter(topic=name, seq__gt=start).values_list("seq", "kind")
            }
        return found

    def missing(self) -> set[tuple[str, int]]:
        return set(self.expected()) - set(self.seen)

    def check(self) -> None:
        """Every event in the database was received, as what it is, and nothing else was."""
        expected = self.expected()
        assert not set(expected) - set(self.seen), sorted(set(expected) - set(self.seen))[:20]
        wrong = {
            key: (kind, expected.get(key))
            for key, (_, kind) in self.seen.items()
            if expected.get(key) != kind
        }
        assert not wrong, f"events received that the database does not hold: {wrong}"

    def summary(self) -> str:
        how = Counter(how for how, _ in self.seen.values())
        return (
            f"{len(self.seen)} events ({how['live']} live, {how['catch-up']} caught up), socket opened "
            f"{self.opened}x, {self.gaps} gaps seen, {self.failed_catch_ups} failed catch-ups"
        )


class Storm:
    """An agent reporting faults at a steady rate, one thread per report: each POST carries an Idempotency-Key and
    is retried every half second while it fails (a 5xx, or no answer), as an agent does. ``answers[i]`` lists
    (seconds since the start, status or error name) of every try of report i; ``ids[i]`` the fault it created."""

    def __init__(self, url: str, token: str, reports: list[dict], rate: float, key: str):
        self.url, self.token, self.reports, self.rate, self.key = url, token, reports, rate, key
        self.answers: dict[int, list[tuple[float, int | str]]] = defaultdict(list)
        self.bodies: dict[int, list[str]] = defaultdict(list)
        self.ids: dict[int, int] = {}
        self.threads: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self) -> "Storm":
        self.t0 = time.monotonic() + 0.2
        self.threads = [
            threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(len(self.reports))
        ]
        for thread in self.threads:
            thread.start()
        return self

    def _send(self, i: int) -> None:
        time.sleep(max(0.0, self.t0 + i / self.rate - time.monotonic()))
        deadline = time.monotonic() + 60
        headers = {"Authorization": f"Bearer {self.token}", "Idempotency-Key": f"{self.key}-{i}"}
        while time.monotonic() < deadline:
            at = time.monotonic() - self.t0
            try:
                response = requests.post(
                    f"{self.url}/api/v1/faults/", json=self.reports[i], headers=headers, timeout=15
                )
            except requests.RequestException as error:
                self.answers[i].append((at, type(error).__name__))
                time.sleep(0.5)
                continue
            self.answers[i].append((at, response.status_code))
            if response.status_code in (200, 201):
                self.ids[i] = response.json()["id"]
                return
            self.bodies[i].append(response.text[:300])
            if response.status_code < 500:
                return  # refused: a 4xx is final
            time.sleep(0.5)

    def join(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def statuses(self) -> Counter:
        return Counter(status for tries in self.answers.values() for _, status in tries)

    def first_tries_between(self, start: float, end: float) -> list[tuple[int, float, int | str]]:
        return [
            (i, tries[0][0], tries[0][1]) for i, tries in self.answers.items() if start <= tries[0][0] < end
        ]


class SupervisedWorker:
    """A Celery worker started again whenever it exits, as docker compose's ``restart: unless-stopped`` does;
    ``restarts`` counts how often it had to."""

    def __init__(self, tmp_path, **options):
        self.tmp_path, self.options = tmp_path, options
        self.stack = ExitStack()
        self.process = self.stack.enter_context(celery_worker(tmp_path, **options))
        self.restarts = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.stop.wait(0.2):
            if self.process.poll() is not None:
                self.restarts += 1
                self.process = self.stack.enter_context(celery_worker(self.tmp_path, **self.options))

    def close(self):
        self.stop.set()
        self.thread.join(90)
        self.stack.close()


def operator_token() -> str:
    return token_header(make_user(Role.OPERATOR), "write")["HTTP_AUTHORIZATION"].removeprefix("Bearer ")


def storm_world(tenant, *, nodes: int = 32, jobs: int = 16):
    """A protected simulated cluster of ``nodes`` nodes (8 GPUs, 8 NICs each) and 4 spares, full of 16-GPU jobs."""
    cluster = protected_cluster(nodes=nodes, spares=4, tenant=tenant)
    placed = [submit(cluster, tenant, gpus=16, checkpoint_interval=10**9) for _ in range(jobs)]
    return cluster, placed


# The second fault on a node, by turns: a flapping link (degraded), an application Xid (restart), a degraded link.
SECOND = [
    {"kind": "link_flap", "nic_name": "mlx5_1"},
    {"kind": "gpu_xid", "xid": 13, "gpu_index": 0},
    {"kind": "link_degraded", "nic_name": "mlx5_2"},
]


def storm_reports(cluster, count: int) -> list[dict]:
    """``count`` different faults over the cluster's nodes, at most two on a node: first a NIC down (NIC
    failover), then one of SECOND. Two strikes stay under the escalation ladder's three, so no node is
    quarantined (quarantine under a storm of reports is test_quarantining_a_node_while_a_fault_is_reported_on_it_does_not_deadlock's
    business)."""
    nodes = list(cluster.nodes.filter(state="ready").order_by("hostname").values_list("pk", flat=True))
    assert count <= 2 * len(nodes)
    reports = []
    for i in range(count):
        node, lap = nodes[i % len(nodes)], i // len(nodes)
        fault = {"kind": "nic_down", "nic_name": "mlx5_0"} if lap == 0 else SECOND[i % len(SECOND)]
        reports.append({"node": node, "source": "agent", **fault})
    return reports


def topics_of(cluster, tenant, jobs, *extra: str) -> list[str]:
    return [
        "fleet",
        f"cluster-{cluster.pk}",
        f"tenant-{tenant.pk}",
        *[f"job-{job.pk}" for job in jobs],
        *extra,
    ]


def settled(fault_ids) -> bool:
    """Every fault closed, and every action it led to finished."""
    faults = FaultEvent.objects.filter(pk__in=fault_ids)
    return (
        faults.count() == len(fault_ids)
        and not faults.exclude(state__in=CLOSED).exists()
        and not RecoveryAction.objects.filter(fault__in=fault_ids).exclude(state__in=FINISHED).exists()
    )


def outcomes(storm: Storm, cluster) -> dict:
    """Check that every report has exactly one outcome; returns the figures."""
    ids = set(storm.ids.values())
    faults = FaultEvent.objects.filter(cluster=cluster)
    assert set(faults.values_list("pk", flat=True)) == ids, (
        "a fault was stored that no report was answered with"
    )
    assert len(ids) == len(storm.ids), "two reports of different faults were merged into one"
    lost = [i for i in range(len(storm.reports)) if i not in storm.ids]
    closed = set(faults.filter(state__in=CLOSED, handled_at__isnull=False).values_list("pk", flat=True))
    lost += [i for i, pk in storm.ids.items() if pk not in closed]
    actions = RecoveryAction.objects.filter(cluster=cluster, job__isnull=False)
    doubled = list(actions.values("fault", "job").annotate(n=Count("id")).filter(n__gt=1))
    assert not doubled, f"a fault got two actions for one job: {doubled}"
    unfinished = list(actions.exclude(state__in=FINISHED).values_list("pk", "kind", "state"))
    assert not unfinished, unfinished
    return {
        "injected": len(storm.reports),
        "lost": len(lost),
        "lost_reports": lost,
        "actions": actions.count(),
        "states": Counter(faults.values_list("state", flat=True)),
        "kinds": Counter(actions.values_list("kind", flat=True)),
    }


def diagnose(storm: Storm, cluster, tmp_path) -> str:
    faults = FaultEvent.objects.filter(cluster=cluster)
    actions = RecoveryAction.objects.filter(cluster=cluster)
    logs = "".join(
        f"\n--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
        for path in sorted(tmp_path.glob("*.log"))
    )
    return (
        f"reports answered {len(storm.ids)}/{len(storm.reports)}: {dict(storm.statuses())}; faults "
        f"{Counter(faults.values_list('state', flat=True))}; actions "
        f"{Counter(actions.values_list('state', flat=True))}"
        f"{logs}"
    )


# --- 1. Redis restarted in the middle of a fault storm ----------------------------------------------------------


def test_redis_restart_during_a_fault_storm_loses_no_fault_and_no_event(tmp_path, settings):
    """60 faults at 5 a second through a real uvicorn; Redis (broker, channel layer, beat lock) is stopped 4 s in
    and started again, empty, 3 s later: the task messages queued in it are gone and the sweeps must find them."""
    server = PrivateRedis().start()
    settings.REDIS_URL = server.url  # the children's Redis (and where celery_worker looks for heartbeats)
    env = {**FAST, "REDIS_URL": server.url}
    tenant = make_tenant()
    cluster, jobs = storm_world(tenant)
    reports = storm_reports(cluster, 60)
    token = operator_token()
    try:
        with ExitStack() as stack:
            web = stack.enter_context(uvicorn_server(tmp_path, **env))
            processes = stack.enter_context(ExitStack())
            worker = SupervisedWorker(tmp_path, concurrency=2, **env)
            processes.callback(worker.close)
            processes.enter_context(celery_beat(tmp_path, **env))
            client = LiveClient(web.port, token, topics_of(cluster, tenant, jobs))
            client.start()
            stack.callback(client.close)
            assert client.subscribed.wait(20), "the websocket client never subscribed"

            storm = Storm(web.url, token, reports, rate=5.0, key="redis").start()
            time.sleep(4.2)
            down_at = time.monotonic() - storm.t0
            server.stop()
            time.sleep(3)
            server.start()
            up = time.monotonic()
            up_at = up - storm.t0
            storm.join()
            try:
                wait_for(
                    lambda: settled(storm.ids.values()) and len(storm.ids) == len(reports),
                    60,
                    0.3,
                    what="every fault closed and every action finished",
                )
            except TimeoutError:
                print(diagnose(storm, cluster, tmp_path))
                raise
            recovered = time.monotonic() - up
            wait_for(lambda: not client.missing(), 30, 0.3, what="the websocket client to hold every event")
            caught_up = time.monotonic() - up
            processes.close()  # worker and beat stop: no more events; the client must still hold them all
            wait_for(lambda: not client.missing(), 15, 0.3, what="the websocket client to hold every event")
            client.check()
    finally:
        server.stop()

    figures = outcomes(storm, cluster)
    during = storm.first_tries_between(down_at, up_at)
    print(
        f"\nRedis down {down_at:.1f}-{up_at:.1f} s into the storm; {len(during)} reports sent meanwhile, answered "
        f"{Counter(s for _, _, s in during)}; every answer {dict(storm.statuses())}"
    )
    print(
        f"faults injected: {figures['injected']}, lost: {figures['lost']}; {figures['states']}; actions "
        f"{dict(figures['kinds'])}"
    )
    print(
        f"recovered {recovered:.1f} s after Redis came back (every fault closed, every action done); client "
        f"complete {caught_up:.1f} s after: {client.summary()}; the worker was restarted {worker.restarts}x"
    )
    assert figures["lost"] == 0, figures["lost_reports"]
    # The fault is stored before anything acts on it: with the broker away, the report is still a 201.
    assert during, "no report was sent while Redis was down"
    assert {status for _, _, status in during} == {201}, (during, dict(storm.bodies))
    assert set(storm.statuses()) == {201}, (storm.statuses(), dict(storm.bodies))


# --- 2. PostgreSQL stopped and started while the workers run ---------------------------------------------------


def rollout_world(actor, count: int = 4):
    """``count`` simulated clusters on version 1 of a blueprint, and a rollout of its version 2 to them, one cluster
    a batch; each Helm apply blocks its caller for 0.3 s, as a slow cluster API would."""
    bp, v1 = blueprint(actor, name="stack-faults", auto_rollout=False)
    targets = clusters_on(v1, count)
    for cluster in targets:
        cluster.connection = {"apply_seconds": 0.5, "call_latency_seconds": 0.3}
        cluster.save(update_fields=["connection"])
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 1, "soak_seconds": 0}
    )
    return rollout, targets


def rollout_done(rollout) -> bool:
    rollout.refresh_from_db()
    return rollout.state not in (RolloutState.PENDING, RolloutState.RUNNING)


def check_rollout(rollout, targets) -> None:
    """A finished rollout agrees with its clusters: every batch passed in order, every cluster applied exactly once,
    carries the new version and is observed running it (its add-ons InSync at the new chart versions)."""
    from fleet.desired import desired_state

    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED, (rollout.state, rollout.reason)
    assert rollout.finished_at is not None
    rows = list(rollout.clusters.all())
    assert {row.cluster_id for row in rows} == {c.pk for c in targets}
    assert {row.status for row in rows} == {RolloutClusterStatus.SUCCEEDED}, [
        (row.cluster_id, row.status, row.reason) for row in rows
    ]
    assert not any(row.open for row in rows), "a finished rollout still holds a cluster"
    batches = list(rollout.batches.order_by("index"))
    assert [b.status for b in batches] == [RolloutBatch.Status.PASSED] * len(targets)
    for earlier, later in zip(batches, batches[1:], strict=False):
        assert later.started_at >= earlier.finished_at, "a batch started before the one before it passed"
    for row in rows:
        batch = batches[row.batch_index]
        assert batch.started_at <= row.applied_at <= batch.finished_at
    applies = Counter(int(a.object_id) for a in AuditEntry.objects.filter(action="rollout.cluster_apply"))
    assert applies == {c.pk: 1 for c in targets}, f"clusters applied more or less than once: {applies}"
    wanted = {name: spec["version"] for name, spec in desired_state(rollout.version).items()}
    for cluster in targets:
        cluster.refresh_from_db()
        assert cluster.blueprint_version_id == rollout.version_id
        observed = dict(SimulatedAddon.objects.filter(cluster=cluster).values_list("name", "version"))
        assert observed == wanted, (cluster.name, observed, wanted)


def test_postgresql_stop_and_start_while_workers_run_loses_no_fault(tmp_path, settings):
    """A private PostgreSQL (initdb on a spare port, so the suite's database stays up) under a uvicorn, a worker and
    beat; a storm of 40 faults at 4 a second and a rollout of 4 clusters run while it is stopped (pg_ctl stop -m
    fast: every session ended) 3 s in and started again 4 s later. Reports made meanwhile must be refused with a
    clear 503 and, retried by the agent, stored once; the worker and beat go on without a restart."""
    try:
        postgres = PrivatePostgres()
    except PrivatePostgresUnavailable as error:
        pytest.skip(f"no private PostgreSQL here: {error}")
    redis_server = PrivateRedis().start()
    settings.REDIS_URL = redis_server.url
    env = {**FAST, "REDIS_URL": redis_server.url}
    try:
        postgres.start()
        postgres.create_database("lockstep_private")
        postgres.migrate("lockstep_private")
        with postgres.use("lockstep_private"):
            tenant = make_tenant()
            cluster, jobs = storm_world(tenant, nodes=20, jobs=10)
            reports = storm_reports(cluster, 40)
            token = operator_token()
            rollout, targets = rollout_world(make_user(Role.OPERATOR))
            with ExitStack() as stack:
                web = stack.enter_context(uvicorn_server(tmp_path, **env))
                processes = stack.enter_context(ExitStack())
                worker = processes.enter_context(celery_worker(tmp_path, concurrency=2, **env))
                beat = processes.enter_context(celery_beat(tmp_path, **env))
                client = LiveClient(
                    web.port, token, topics_of(cluster, tenant, jobs, f"rollout-{rollout.pk}")
                )
                client.start()
                stack.callback(client.close)
                assert client.subscribed.wait(20), "the websocket client never subscribed"
                wait_for(
                    lambda: Rollout.objects.get(pk=rollout.pk).state == RolloutState.RUNNING,
                    20,
                    what="beat's tick to start the rollout",
                )

                storm = Storm(web.url, token, reports, rate=4.0, key="postgres").start()
                time.sleep(3.2)
                down_at = time.monotonic() - storm.t0
                postgres.stop("fast")
                readyz_down = requests.get(f"{web.url}/readyz", timeout=30)
                time.sleep(4)
                postgres.start()
                up = time.monotonic()
                up_at = up - storm.t0
                connection.close()  # this thread's session died with the server
                storm.join()
                try:
                    wait_for(
                        lambda: settled(storm.ids.values()) and len(storm.ids) == len(reports),
                        60,
                        0.3,
                        what="every fault closed and every action finished",
                    )
                    recovered = time.monotonic() - up
                    wait_for(lambda: rollout_done(rollout), 60, 0.5, what="the rollout to finish")
                    rolled_out = time.monotonic() - up
                except TimeoutError:
                    print(diagnose(storm, cluster, tmp_path))
                    raise
                wait_for(
                    lambda: not client.missing(), 30, 0.3, what="the websocket client to hold every event"
                )
                caught_up = time.monotonic() - up
                alive = {"worker": worker.poll() is None, "beat": beat.poll() is None}
                processes.close()
                wait_for(
                    lambda: not client.missing(), 15, 0.3, what="the websocket client to hold every event"
                )
                client.check()
                logs = web.output()

            figures = outcomes(storm, cluster)
            check_rollout(rollout, targets)
            during = storm.first_tries_between(down_at, up_at)
            print(
                f"\nPostgreSQL down {down_at:.1f}-{up_at:.1f} s into the storm; {len(during)} reports sent "
                "meanwhile, "
                f"first answered {Counter(s for _, _, s in during)}; every answer {dict(storm.statuses())}; "
                f"/readyz while down: {readyz_down.status_code}"
            )
            print(
                f"faults injected: {figures['injected']}, lost: {figures['lost']}; {figures['states']}; actions "
                f"{dict(figures['kinds'])}"
            )
            print(
                f"recovered {recovered:.1f} s after PostgreSQL came back (every fault closed, every action done); "
                f"rollout finished {rolled_out:.1f} s after; client complete {caught_up:.1f} s after: "
                f"{client.summary()}"
            )
            assert figures["lost"] == 0, figures["lost_reports"]
            assert alive == {"worker": True, "beat": True}, alive
            assert readyz_down.status_code == 503
            assert during, "no report was sent while PostgreSQL was down"
            # Each report stored once, however often it was retried.
            assert set(FaultEvent.objects.filter(cluster=cluster).values_list("report_count", flat=True)) == {
                1
            }
            refused = Counter(
                status for tries in storm.answers.values() for _, status in tries if status not in (200, 201)
            )
            assert set(refused) <= {503}, (
                refused,
                [b for bodies in storm.bodies.values() for b in bodies][:5],
            )
            assert "Traceback" not in logs, logs[-3000:]
    finally:
        redis_server.stop()
        postgres.destroy()


# --- 3. A worker killed mid-decision, and between its commit and the relay of its events -----------------------


def hold_jobs(cluster):
    """Another session holds the cluster's job rows: a decision blocks half-way, after it took its faults."""
    holder = psycopg.connect(database_url(), autocommit=False)
    holder.execute("SELECT id FROM jobs_job WHERE cluster_id = %s FOR UPDATE", [cluster.pk])
    return holder


def test_a_worker_killed_mid_decision_and_before_its_relay_loses_nothing_and_acts_once(tmp_path, settings):
    """Eight faults on a cluster of four jobs, decided as one batch. The first worker is SIGKILLed while its decision
    waits for the job rows: nothing of it may remain. The second decides the batch and commits, but Redis is frozen
    (SIGSTOP), so its after-commit relay hangs; it is SIGKILLed there, with its events written and unsent. A third
    worker and beat's sweeps finish the work: one action per fault and job, the events sent once by the outbox
    sweep, and the websocket client holds every one of them."""
    server = PrivateRedis().start()
    settings.REDIS_URL = server.url
    env = {**FAST, "REDIS_URL": server.url}
    tenant = make_tenant()
    cluster = protected_cluster(nodes=8, spares=2, tenant=tenant)
    jobs = [submit(cluster, tenant, gpus=16, checkpoint_interval=10**9) for _ in range(4)]
    nodes = list(cluster.nodes.filter(state="ready").order_by("hostname").values_list("pk", flat=True))
    reports = [{"node": node, "kind": "nic_down", "nic_name": "mlx5_0", "source": "agent"} for node in nodes]
    token = operator_token()
    holder = None
    try:
        with ExitStack() as stack:
            web = stack.enter_context(uvicorn_server(tmp_path, **env))
            stack.enter_context(celery_beat(tmp_path, **env))
            client = LiveClient(web.port, token, topics_of(cluster, tenant, jobs))
            client.start()
            stack.callback(client.close)
            assert client.subscribed.wait(20), "the websocket client never subscribed"
            storm = Storm(web.url, token, reports, rate=20.0, key="kill").start()
            storm.join()
            assert len(storm.ids) == len(reports), storm.answers
            fault_ids = list(storm.ids.values())

            # 1. Killed while its decision waits for the job rows.
            holder = hold_jobs(cluster)
            with celery_worker(tmp_path, **env) as first:
                wait_for(lambda: lock_waiters() > 0, 30, what="the decision to block on the job rows")
                kill_group(first)
            holder.rollback()  # the dead worker's session ends once it gets the rows
            wait_for(lambda: lock_waiters() == 0, 30, what="the dead worker's session to end")
            states = set(FaultEvent.objects.filter(pk__in=fault_ids).values_list("state", flat=True))
            assert states == {FaultState.NEW}, states
            assert not RecoveryAction.objects.filter(fault__in=fault_ids).exists()
            assert not Event.objects.filter(kind="actions.decided").exists()

            # 2. Killed after its commit, in the relay: Redis is frozen, so the relay hangs (for up to 30 s).
            holder.execute("SELECT id FROM jobs_job WHERE cluster_id = %s FOR UPDATE", [cluster.pk])
            with celery_worker(tmp_path, OUTBOX_RELAY_TIMEOUT=30, **env) as second:
                wait_for(
                    lambda: lock_waiters() > 0,
                    30,
                    what="beat's fault sweep to hand the batch to the new worker",
                )
                server.process.send_signal(signal.SIGSTOP)
                stack.callback(lambda: server.process and server.process.send_signal(signal.SIGCONT))
                holder.rollback()
                wait_for(
                    lambda: not FaultEvent.objects.filter(pk__in=fault_ids, state=FaultState.NEW).exists(),
                    30,
                    what="the decision to commit",
                )
                time.sleep(0.5)
                decided = set(Event.objects.filter(kind="actions.decided").values_list("pk", flat=True))
                unsent = set(
                    Event.objects.filter(pk__in=decided, sent_at__isnull=True).values_list("pk", flat=True)
                )
                kill_group(second)
            server.process.send_signal(signal.SIGCONT)
            resumed = time.monotonic()

            # 3. A fresh worker; beat's sweeps send the events and finish the actions.
            processes = stack.enter_context(ExitStack())
            processes.enter_context(celery_worker(tmp_path, **env))
            try:
                wait_for(
                    lambda: settled(fault_ids), 60, 0.3, what="every fault closed and every action finished"
                )
            except TimeoutError:
                print(diagnose(storm, cluster, tmp_path))
                raise
            recovered = time.monotonic() - resumed
            wait_for(
                lambda: not Event.objects.filter(pk__in=decided, sent_at__isnull=True).exists(),
                30,
                0.3,
                what="the outbox sweep to send the dead worker's events",
            )
            sent_again = time.monotonic() - resumed
            wait_for(lambda: not client.missing(), 30, 0.3, what="the websocket client to hold every event")
            caught_up = time.monotonic() - resumed
            processes.close()
            wait_for(lambda: not client.missing(), 15, 0.3, what="the websocket client to hold every event")
            client.check()
    finally:
        if holder is not None:
            holder.close()
        server.stop()

    figures = outcomes(storm, cluster)
    print(
        f"\nfaults injected: {figures['injected']}, lost: {figures['lost']}; {figures['states']}; actions "
        f"{dict(figures['kinds'])}; {len(unsent)} of {len(decided)} decision events unsent when the worker died"
    )
    print(
        f"after the kill: every fault closed {recovered:.1f} s, its events sent {sent_again:.1f} s, client "
        f"complete {caught_up:.1f} s; {client.summary()}"
    )
    assert figures["lost"] == 0, figures["lost_reports"]
    # The second worker died with its decision committed and none of its events sent.
    assert decided and unsent == decided, (unsent, decided)
    # Decided once: one batch, one action per fault and job (each NIC down hits the one job on its node).
    assert Event.objects.filter(kind="actions.decided", topic=f"cluster-{cluster.pk}").count() == 1
    actions = RecoveryAction.objects.filter(cluster=cluster, job__isnull=False)
    assert actions.count() == len(reports) and set(actions.values_list("state", flat=True)) == {
        ActionState.SUCCEEDED
    }
    # Each action carried out once on the cluster: one driver operation each, of its kind.
    operations = Counter(
        SimulatedOperation.objects.filter(cluster=cluster)
        .filter(operation__in=["nic_failover", "migrate_worker"])
        .values_list("operation", flat=True)
    )
    kinds = Counter(actions.values_list("kind", flat=True))
    expected = Counter({"nic_failover": kinds["nic_failover"], "migrate_worker": kinds["live_migration"]})
    assert operations == +expected, (operations, kinds)  # (+: drops kinds the decision chose none of)


# --- What the faults above found: each pinned by a focused test ---------------------------------------------------


def test_a_worker_with_a_task_in_hand_survives_a_redis_restart(tmp_path, settings):
    server = PrivateRedis().start()
    settings.REDIS_URL = server.url
    env = {**FAST, "REDIS_URL": server.url}
    tenant = make_tenant()
    cluster = protected_cluster(nodes=2, spares=1, tenant=tenant)
    submit(cluster, tenant, gpus=16, checkpoint_interval=10**9)
    node = cluster.nodes.filter(state="ready").order_by("hostname").first()
    holder = hold_jobs(cluster)
    try:
        with uvicorn_server(tmp_path, **env) as web, celery_worker(tmp_path, concurrency=2, **env) as worker:
            response = requests.post(
                f"{web.url}/api/v1/faults/",
                json={"node": node.pk, "kind": "nic_down", "nic_name": "mlx5_0", "source": "agent"},
                headers={"Authorization": f"Bearer {operator_token()}"},
                timeout=20,
            )
            assert response.status_code == 201, response.text
            wait_for(
                lambda: lock_waiters() > 0, 30, what="the worker to hold the fault's task, unacknowledged"
            )
            server.stop()
            time.sleep(1)
            server.start()
            time.sleep(4)  # the worker finds its broker connection gone and reconnects
            holder.rollback()  # the task finishes (a worker on its way out waits for it)
            time.sleep(3)
            alive = worker.poll() is None
            log = worker.log.read_text()
    finally:
        holder.close()
        server.stop()
    assert alive and "Unrecoverable error" not in log, log[-3000:]


def test_quarantining_a_node_while_a_fault_is_reported_on_it_does_not_deadlock(tenant_a):
    """The order a decision takes its locks in (fault_handle: the cluster; decide: the faults' nodes; the escalation
    ladder: cordon the node), against a fault report on the same node arriving in between."""
    from fleet.models import Node
    from fleet.services.nodes import node_cordon
    from jobs.placement import lock_cluster, lock_nodes
    from jobs.services.faults import fault_ingest

    cluster = protected_cluster(nodes=2, spares=0, tenant=tenant_a)
    node = cluster.nodes.order_by("hostname").first()
    errors: list[str] = []
    locked, go = threading.Event(), threading.Event()

    def decide():
        try:
            with transaction.atomic():
                lock_cluster(cluster.pk)
                lock_nodes([node.pk])
                locked.set()
                go.wait(20)
                node_cordon(
                    actor=None, node=Node.objects.get(pk=node.pk), reason="quarantine: 3 faults in an hour"
                )
        except Exception as error:
            errors.append(f"decision: {error!r}")
        finally:
            connection.close()

    def report():
        locked.wait(20)
        try:
            fault_ingest(
                source="agent",
                kind="nic_down",
                node=Node.objects.select_related("cluster").get(pk=node.pk),
                nic_name="mlx5_1",
            )
        except Exception as error:
            errors.append(f"report: {error!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide), threading.Thread(target=report)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: lock_waiters() > 0, 20, what="the report to wait for the node row")
    finally:
        go.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors
    assert Node.objects.get(pk=node.pk).state == "cordoned"
    assert FaultEvent.objects.filter(node=node).count() == 1


def test_the_api_answers_503_while_the_database_is_unreachable(tmp_path, transactional_db):
    """A web process whose database does not answer (nothing listens on its port): a fault report and a list are a
    clear 503 with Retry-After (controlplane/middleware.py), not a 500 with a traceback; /readyz says which check
    failed."""
    from tests.support.processes import free_port

    down = f"postgres://postgres@127.0.0.1:{free_port()}/lockstep"
    headers = {"Authorization": "Bearer lsk_abcd1234_" + "s" * 43}  # well formed: only the database can tell
    with uvicorn_server(tmp_path, DATABASE_URL=down) as web, ThreadPoolExecutor(3) as pool:
        # At once: each waits for the web process's connection pool (its timeout) before it is refused.
        calls = {
            "readyz": pool.submit(requests.get, f"{web.url}/readyz", timeout=30),
            "report": pool.submit(
                requests.post,
                f"{web.url}/api/v1/faults/",
                json={"node": 1, "kind": "nic_down"},
                headers=headers,
                timeout=30,
            ),
            "list": pool.submit(requests.get, f"{web.url}/api/v1/faults/", headers=headers, timeout=30),
        }
        answers = {what: call.result() for what, call in calls.items()}
        log = web.output()
    ready = answers.pop("readyz")
    assert ready.status_code == 503 and not ready.json()["checks"]["database"]["ok"]
    for what, answer in answers.items():
        assert answer.status_code == 503, (what, answer.status_code, answer.text[:200])
        assert answer.headers.get("Retry-After"), what
        assert "database" in answer.json()["detail"], (what, answer.text)
    assert "Traceback" not in log, log[-2000:]
