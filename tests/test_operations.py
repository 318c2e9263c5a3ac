"""Operations with real processes: one beat schedules however many run; two web processes and two workers share
one PostgreSQL and one Redis; retention prunes while agents keep posting."""

import ast
import itertools
import json
import re
import signal
import threading
import time
from contextlib import ExitStack
from datetime import datetime, timedelta

import pytest
import redis
import requests
from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.access import Role
from controlplane.beat import LOCK_KEY
from controlplane.models import AuditEntry, Event
from controlplane.tasks import retention_prune_task
from jobs.choices import ActionKind, ActionState, FaultState
from jobs.models import FaultEvent, JobAllocation, RecoveryAction
from telemetry.models import GPUSample, IngestBatch, NodeMinute
from telemetry.services.tokens import agent_token_create
from telemetry.tasks import telemetry_prune_task
from tests.support.factories import make_cluster, make_node, make_user, token_header
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import (
    PrivateRedis,
    celery_beat,
    celery_worker,
    kill_group,
    uvicorn_server,
    wait_for,
)
from tests.support.telemetry import batch, reading

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Beat at test speed: a heartbeat (and so a lock renewal) every second, the lock lapses after three.
FAST_BEAT = {
    "HEARTBEAT_SECONDS": 1,
    "RECOVERY_ADVANCE_SECONDS": 1,
    "FAULT_SWEEP_SECONDS": 1,
    "OUTBOX_SWEEP_SECONDS": 1,
}
LOCK_SECONDS, RENEW_SECONDS = 3, 1
# Every one-second entry of the schedule, and how long each message may wait (its `expires` option).
EVERY_SECOND = {"jobs.recovery_advance": 2, "jobs.fault_sweep": 2, "controlplane.outbox_sweep": 2}


def sent_messages(client: redis.Redis) -> list[dict]:
    """Every task message waiting in the broker's queues (no worker consumes them here): task, sender pid, time
    sent. Beat routes tasks to the queue of their urgency (settings.CELERY_TASK_QUEUES)."""
    from django.conf import settings

    sent = []
    raws = [raw for queue in settings.CELERY_TASK_QUEUES for raw in client.lrange(queue.name, 0, -1)]
    for raw in raws:
        headers = json.loads(raw)["headers"]
        if headers["task"] not in EVERY_SECOND:
            continue
        expires = datetime.fromisoformat(headers["expires"])
        sent.append(
            {
                "task": headers["task"],
                "pid": int(headers["origin"].split("@")[0].removeprefix("gen")),
                "at": (expires - timedelta(seconds=EVERY_SECOND[headers["task"]])).timestamp(),
            }
        )
    return sorted(sent, key=lambda message: message["at"])


def holder_pid(client: redis.Redis) -> int | None:
    value = client.get(LOCK_KEY)
    return int(value.decode().split(":")[1]) if value else None


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def started(beat) -> bool:
    return "beat: Starting..." in beat.log.read_text()


def test_two_beats_schedule_once_and_the_survivor_takes_over_when_the_holder_dies(tmp_path, private_redis):
    env = {**FAST_BEAT, "REDIS_URL": private_redis.url}
    client = redis.Redis.from_url(private_redis.url)
    with celery_beat(tmp_path, "a", **env) as a, celery_beat(tmp_path, "b", **env) as b:
        beats = {a.pid: a, b.pid: b}
        wait_for(
            lambda: started(a) and started(b) and holder_pid(client) in beats,
            60,
            what=f"two beats, one holding the lock ({a.log.read_text()[-400:]} {b.log.read_text()[-400:]})",
        )
        time.sleep(1.5)  # both beats tick: the one holding and the one standing by
        window_start = time.time()
        time.sleep(8)
        window_end = time.time()
        holder = beats[holder_pid(client)]
        survivor = b if holder is a else a
        killed_at = kill_group(holder)
        wait_for(
            lambda: holder_pid(client) == survivor.pid,
            LOCK_SECONDS + 5,
            0.05,
            what="the survivor to take the lock",
        )
        time.sleep(5)
        messages = sent_messages(client)
        assert survivor.poll() is None, survivor.log.read_text()[-2000:]

    before = [m for m in messages if m["at"] < killed_at]
    after = [m for m in messages if m["at"] >= killed_at]
    # Only the holder sent while both ran; only the survivor after it died.
    assert {m["pid"] for m in before} == {holder.pid}
    assert {m["pid"] for m in after} == {survivor.pid}
    for task in EVERY_SECOND:
        times = [m["at"] for m in messages if m["task"] == task]
        in_window = [t for t in times if window_start <= t < window_end]
        # Once a second over eight seconds, not twice; no two sends of one entry closer than its interval allows.
        assert 6 <= len(in_window) <= 10, (task, len(in_window))
        assert min(gaps(times)) > 0.8, (task, gaps(times))
        first_after = min(t for t in times if t >= killed_at)
        # The survivor takes over within the lock's lifetime and one renewal interval.
        assert first_after - killed_at < LOCK_SECONDS + RENEW_SECONDS + 1.0, (task, first_after - killed_at)
        print(
            f"{task}: {len(in_window)} sends in 8 s with two beats; first send {first_after - killed_at:.2f} s "
            "after the holder was killed"
        )
    # The one standing by sent nothing before it took the lock.
    assert "Sending due task" not in survivor.log.read_text().split("took the lock")[0]


def test_a_stopped_holder_hands_over_at_once_and_beats_survive_a_redis_restart(tmp_path):
    server = PrivateRedis().start()
    env = {**FAST_BEAT, "REDIS_URL": server.url}
    client = redis.Redis.from_url(server.url)
    try:
        with ExitStack() as stack:
            a = stack.enter_context(celery_beat(tmp_path, "a", **env))
            wait_for(
                lambda: holder_pid(client) == a.pid,
                60,
                what=f"beat a to take the lock ({a.log.read_text()[-400:]})",
            )
            b = stack.enter_context(celery_beat(tmp_path, "b", **env))
            wait_for(lambda: started(b), 60, what="beat b")
            time.sleep(1.5)
            assert holder_pid(client) == a.pid
            # A clean stop releases the lock: b takes it at its next try, not after the lock expires.
            stopped_at = kill_group(a, signal.SIGTERM)
            wait_for(lambda: holder_pid(client) == b.pid, LOCK_SECONDS + 5, 0.05, what="b to take the lock")
            handover = time.time() - stopped_at
            assert handover < RENEW_SECONDS + 0.5, handover
            c = stack.enter_context(celery_beat(tmp_path, "c", **env))
            wait_for(lambda: started(c), 60, what="beat c")
            time.sleep(1.5)

            # Redis restarts empty: no lock, no last runs. One of the two beats takes the lock again and
            # periodic tasks resume; neither beat process ends.
            server.stop()
            time.sleep(2)
            server.start()
            restarted_at = time.time()
            wait_for(
                lambda: holder_pid(client) in (b.pid, c.pid), 15, 0.05, what="a beat to take the new lock"
            )
            time.sleep(4)
            messages = sent_messages(client)
            assert b.poll() is None and c.poll() is None, (
                b.log.read_text()[-2000:] + c.log.read_text()[-2000:]
            )
    finally:
        server.stop()
    print(f"handover after SIGTERM: {handover:.2f} s")
    assert len({m["pid"] for m in messages}) == 1
    times = [m["at"] for m in messages if m["task"] == "jobs.recovery_advance"]
    assert times and times[0] - restarted_at < LOCK_SECONDS + RENEW_SECONDS + 1.0
    assert len(times) >= 3 and min(gaps(times)) > 0.8, gaps(times)


# --- two web processes, two workers, two beats: one PostgreSQL, one Redis -------------------------------------


class EventReader(threading.Thread):
    """A websocket client on one web process that keeps every event it receives."""

    def __init__(self, ws, topics: list[str]):
        super().__init__(daemon=True)
        self.ws = ws
        assert json.loads(self.ws.recv(timeout=20))["type"] == "hello"
        self.ws.send(json.dumps({"subscribe": topics}))
        assert json.loads(self.ws.recv(timeout=20))["topics"] == topics
        self.events: list[dict] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                message = json.loads(self.ws.recv(timeout=0.2))
            except TimeoutError:
                continue
            except ConnectionClosed:
                return
            if message.get("type") == "event":
                self.events.append(message)

    def close(self):
        self.stop.set()
        self.join(5)

    def kinds(self, kind: str) -> list[dict]:
        return [event for event in self.events if event["kind"] == kind]

    def succeeded_actions(self) -> set[int]:
        """Actions heard of as succeeded: one by one (action.succeeded) or in a batch (actions.completed)."""
        batched = [a for event in self.kinds("actions.completed") for a in event["payload"]["actions"]]
        single = [event["payload"] for event in self.kinds("action.succeeded")]
        return {a["action"] for a in batched + single if a["state"] == ActionState.SUCCEEDED}


def test_two_web_processes_and_two_workers_handle_each_fault_exactly_once(
    tmp_path, settings, private_redis, tenant_a
):
    settings.REDIS_URL = (
        private_redis.url
    )  # the children's Redis (broker, channel layer, heartbeats, beat lock)
    cluster = protected_cluster(nodes=8, spares=4)
    jobs = [submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9) for _ in range(4)]
    failing = [JobAllocation.objects.filter(job=job).order_by("rank_start").first().node for job in jobs]
    header = token_header(make_user(Role.OPERATOR), "write")["HTTP_AUTHORIZATION"]
    auth = {"Authorization": header}
    env = {**FAST_BEAT, "REDIS_URL": private_redis.url}

    with ExitStack() as stack:
        web_a = stack.enter_context(uvicorn_server(tmp_path, **env))
        web_b = stack.enter_context(uvicorn_server(tmp_path, **env))
        workers = [stack.enter_context(celery_worker(tmp_path, **env)) for _ in range(2)]
        beats = [stack.enter_context(celery_beat(tmp_path, name, **env)) for name in ("one", "two")]
        ws = stack.enter_context(
            connect(
                f"ws://127.0.0.1:{web_b.port}/ws/events/",
                additional_headers={"Authorization": header},
                open_timeout=20,
            )
        )
        reader = EventReader(ws, ["fleet"])
        reader.start()
        stack.callback(reader.close)

        # Each fault reported twice, once through each web process, with one idempotency key: web A takes the
        # first report of faults 0 and 1, web B of faults 2 and 3.
        reported = {}
        for i, node in enumerate(failing):
            first, second = (web_a, web_b) if i < 2 else (web_b, web_a)
            for server in (first, second):
                response = requests.post(
                    f"{server.url}/api/v1/faults/",
                    json={"node": node.pk, "kind": "node_unreachable"},
                    headers={**auth, "Idempotency-Key": f"ops-{i}"},
                    timeout=20,
                )
                assert response.status_code in (200, 201), response.text
                reported.setdefault(i, []).append((server.port, response.status_code, response.json()["id"]))

        def settled():
            faults = FaultEvent.objects.filter(cluster=cluster)
            actions = RecoveryAction.objects.filter(cluster=cluster, job__isnull=False)
            return (
                faults.count() == 4
                and not faults.exclude(state=FaultState.HANDLED).exists()
                and actions.count() >= 4
                and not actions.exclude(state=ActionState.SUCCEEDED).exists()
            )

        wait_for(settled, 90, 0.5, what="every fault handled and every migration done")
        migrations = set(
            RecoveryAction.objects.filter(cluster=cluster, job__isnull=False).values_list("pk", flat=True)
        )
        wait_for(
            lambda: reader.succeeded_actions() >= migrations,
            20,
            what=f"web B's client to hear every migration succeed ({[e['kind'] for e in reader.events]})",
        )
        listings = {}
        for server in (web_a, web_b):
            sent = time.time()
            response = requests.get(
                f"{server.url}/api/v1/actions/",
                headers=auth,
                timeout=20,
                params={"cluster": cluster.pk, "kind": ActionKind.LIVE_MIGRATION, "page_size": 500},
            )
            listings[server.port] = (sent, response.status_code, response.json())
        holders = [holder_pid(redis.Redis.from_url(private_redis.url))]
        logs = [worker.log.read_text() for worker in workers]
        beat_logs = {beat.pid: beat.log.read_text() for beat in beats}

    # Each report's first answer created the fault (201), its second through the other process joined it (200).
    for i, answers in reported.items():
        assert [code for _, code, _ in answers] == [201, 200] and answers[0][2] == answers[1][2], answers
        assert answers[0][0] == (web_a.port if i < 2 else web_b.port)
    # Exactly one outcome per fault: handled once, one migration for its job, onto a spare of its own.
    faults = FaultEvent.objects.filter(cluster=cluster)
    assert faults.count() == 4 and set(faults.values_list("report_count", flat=True)) == {2}
    actions = RecoveryAction.objects.filter(cluster=cluster, job__isnull=False)
    assert actions.count() == 4 and actions.values("fault").distinct().count() == 4
    assert set(actions.values_list("kind", flat=True)) == {ActionKind.LIVE_MIGRATION}
    assert len(set(actions.values_list("to_node", flat=True))) == 4
    assert set(actions.values_list("job", flat=True)) == {job.pk for job in jobs}
    # A websocket client on web B heard the faults reported through web A and what the workers did.
    heard = {e["url"] for e in reader.kinds("fault.reported")}
    assert heard == {f"/api/v1/faults/{pk}/" for pk in faults.values_list("pk", flat=True)}, heard
    assert len(reader.kinds("fault.reported")) == 4  # a report joined to a fault is no new event
    # Both web processes answer from the one database alike: the finished migrations, each as the other lists it
    # (node-level drains may still be moving between the two requests, so the listing asks for migrations only).
    rows = list(actions.order_by("-planned_at", "-id").values_list("id", "state", "planned_at"))
    why = f"the database: {rows}; each web process (port: sent at, status, answer): {listings}"
    (_, status_a, body_a), (_, status_b, body_b) = listings[web_a.port], listings[web_b.port]
    assert status_a == status_b == 200, why
    assert [a["id"] for a in body_a["results"]] == [row[0] for row in rows] and body_a["count"] == 4, why
    assert body_a == body_b, why
    # Both workers did work, and nothing failed in either.
    for log in logs:
        assert "Traceback" not in log, log[-3000:]
        assert log.count(" succeeded in ") > 0, log[-2000:]
    # Two beats ran, one scheduled.
    (holder,) = holders
    assert holder in beat_logs
    for pid, log in beat_logs.items():
        assert ("Sending due task" in log) == (pid == holder), log[-1500:]
    print(
        f"tasks done per worker: {[log.count(' succeeded in ') for log in logs]}; "
        f"events heard on web B: {len(reader.events)}"
    )


# --- retention prunes while agents keep posting ----------------------------------------------------------------


# table, time column, retention (seconds, from settings), rows seeded, SQL of one seeded row ({t} is its time).
def retention_tables(cluster, nodes, gpu_id):
    raw = settings.TELEMETRY_RAW_RETENTION_HOURS * 3600
    history = settings.TELEMETRY_HISTORY_DAYS * 86400
    return [
        (
            GPUSample,
            "ts",
            raw,
            120_000,
            "INSERT INTO {table} (ts, gpu_id, temperature) SELECT {t}, %s, 50.0 FROM {series}",
            [gpu_id],
        ),
        (
            IngestBatch,
            "received_at",
            raw,
            2_000,
            "INSERT INTO {table} (batch_id, cluster_id, received_at, readings, nics, events, facility, faults) "
            "SELECT gen_random_uuid(), %s, {t}, 1, 0, 0, 0, 0 FROM {series}",
            [cluster.pk],
        ),
        (
            NodeMinute,
            "minute",
            history,
            5_000,
            "INSERT INTO {table} (node_id, minute, samples, temperature_sum, power_sum, utilization_sum) "
            "SELECT %s, date_trunc('minute', {t}), 1, 50, 400, 90 FROM {series} "
            "ON CONFLICT DO NOTHING",
            [nodes[0].pk],
        ),
        (
            Event,
            "created_at",
            settings.EVENT_RETENTION_DAYS * 86400,
            20_000,
            "INSERT INTO {table} (topic, seq, kind, payload, url, created_at, sent_at) "
            "SELECT 'retention-test', g, 'test.old', '{{}}'::jsonb, '', {t}, {t} FROM {series}",
            [],
        ),
        (
            AuditEntry,
            "created_at",
            settings.AUDIT_RETENTION_DAYS * 86400,
            5_000,
            "INSERT INTO {table} (created_at, actor_name, token_prefix, source, action, object_type, object_id, "
            "object_repr, changes) SELECT {t}, '', '', 'system', 'test.old', 'test', '', '', '{{}}'::jsonb FROM {series}",
            [],
        ),
    ]


def seed_around_cutoff(model, column, retention, rows, sql, params, now) -> dict[int, float]:
    """``rows`` rows evenly spread from a quarter of the retention period before its cutoff to a quarter after;
    returns their ids and times (epoch seconds)."""
    oldest = now - retention * 1.25
    newest = now - retention * 0.75
    t = f"to_timestamp({oldest} + ({newest} - {oldest}) * g / {rows}.0)"
    with connection.cursor() as cursor:
        cursor.execute(
            sql.format(table=model._meta.db_table, t=t, series=f"generate_series(0, {rows - 1}) AS g"), params
        )
    return {
        pk: at.timestamp()
        for pk, at in model.objects.filter(
            **{f"{column}__lt": timezone.now() - timedelta(seconds=retention * 0.5)}
        ).values_list("pk", column)
    }


def test_retention_prunes_while_agents_keep_posting(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("seeds with PostgreSQL's generate_series; the suite's database is PostgreSQL")
    cluster = make_cluster()
    nodes = [make_node(cluster, f"ret-{i}", gpus=8, nics=0) for i in range(4)]
    _, token = agent_token_create(actor=None, cluster=cluster, name="retention")
    now = time.time()
    seeded = {}
    for model, column, retention, rows, sql, params in retention_tables(
        cluster, nodes, nodes[0].gpus.first().pk
    ):
        seeded[model] = (
            column,
            retention,
            seed_around_cutoff(model, column, retention, rows, sql, params, now),
        )
    ingest_from = timezone.now()
    posts, stop = [], threading.Event()

    def post_telemetry(url):
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        for i in itertools.count():
            if stop.is_set():
                return
            node = nodes[i % len(nodes)]
            at = time.time()
            body = batch(
                node.hostname,
                readings=[reading(g, at - 1) for g in range(8)] + [reading(g, at) for g in range(8)],
            )
            try:
                response = session.post(f"{url}/api/v1/ingest/telemetry/", json=body, timeout=30)
                posts.append((at, time.time(), response.status_code, response.json().get("readings")))
            except Exception as error:  # recorded as a failed post
                posts.append((at, time.time(), repr(error), 0))

    with uvicorn_server(tmp_path) as web, celery_worker(tmp_path, concurrency=2) as worker:
        poster = threading.Thread(target=post_telemetry, args=(web.url,))
        poster.start()
        try:
            wait_for(lambda: len(posts) >= 10, 30, what="ingest to be under way")
            triggered = time.time()
            telemetry_prune_task.delay()
            retention_prune_task.delay()
            # Both by name: the worker may also run tasks an earlier test left queued in the suite's Redis.
            finished = re.compile(r"Task (telemetry|controlplane)\.retention_prune\[[^]]+\] succeeded in ")
            wait_for(
                lambda: len(finished.findall(worker.log.read_text())) >= 2,
                120,
                0.2,
                what="both retention tasks to finish",
            )
            done = time.time()
            time.sleep(1)
        finally:
            stop.set()
            poster.join(30)
        log = worker.log.read_text()

    assert "Traceback" not in log, log[-3000:]
    # Ingest never failed, also while the prune ran.
    assert posts and {code for _, _, code, _ in posts} == {200}, [p for p in posts if p[2] != 200][:5]
    # At least one post was in flight while the prune ran (started before it ended, answered after it began).
    during = [p for p in posts if p[0] <= done and p[1] >= triggered]
    assert during, "no batch was posted while the prune ran"
    readings = sum(n for _, _, _, n in posts)
    assert readings == 16 * len(posts)
    # Everything older than the cutoff went, nothing newer did; the cutoff is taken while the task runs.
    for model, (_, retention, rows) in seeded.items():
        kept = set(model.objects.filter(pk__in=rows.keys()).values_list("pk", flat=True))
        deleted = rows.keys() - kept
        assert kept and deleted, model
        assert max(rows[pk] for pk in deleted) < done - retention, model
        assert min(rows[pk] for pk in kept) >= triggered - retention, model
        print(f"{model.__name__}: {len(deleted)} pruned, {len(kept)} kept")
    # What was ingested meanwhile is all there.
    assert GPUSample.objects.filter(ts__gte=ingest_from - timedelta(seconds=5)).count() == readings
    assert IngestBatch.objects.filter(received_at__gte=ingest_from).count() == len(posts)
    assert (
        NodeMinute.objects.filter(minute__gte=ingest_from - timedelta(minutes=1)).aggregate(n=Sum("samples"))[
            "n"
        ]
        == readings
    )
    reported = {
        name: (float(seconds), ast.literal_eval(counts))
        for name, seconds, counts in re.findall(
            r"Task (\S+retention_prune)\[[^]]+\] succeeded in ([\d.]+)s: (\{.*\})", log
        )
    }
    assert set(reported) == {"telemetry.retention_prune", "controlplane.retention_prune"}, log[-2000:]
    assert reported["telemetry.retention_prune"][1]["gpu_samples"] == len(seeded[GPUSample][2]) - len(
        set(GPUSample.objects.filter(pk__in=seeded[GPUSample][2].keys()).values_list("pk", flat=True))
    )
    print(
        f"ingest: {len(posts)} batches ({readings} readings) posted, {len(during)} while the prune ran "
        f"({done - triggered:.1f} s); the tasks reported {reported}"
    )
