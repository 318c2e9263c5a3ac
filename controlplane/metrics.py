"""Lockstep's own health for /metrics: the outbox, the Celery queues, worker and beat heartbeats, and how long
the periodic sweeps take. The alert rules in deploy/prometheus/rules/lockstep.rules.yml read these.

Everything is read at scrape time from where it already lives (the outbox table, the broker's lists, the
heartbeat keys), except the sweeps' durations, which workers write to one Redis hash as each sweep ends
(``sweep_started``/``sweep_finished``, hooked to Celery's task signals in controlplane/celery.py). Redis away
leaves its families out and says so in ``lockstep_redis_up``; the scrape still answers.
"""

import json
import time
from datetime import timedelta

import redis
from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from controlplane.heartbeat import read_heartbeats, redis_client
from controlplane.models import Event

SWEEPS_KEY = "lockstep:sweeps"
ROLES = ("worker", "beat")
# Kombu's Redis transport keeps a queue's messages of priority p > 0 in the list "<queue>\x06\x16<p>".
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)

_started: dict[str, float] = {}


def sweep_intervals() -> dict[str, float]:
    """Each beat-scheduled task's interval, seconds (the sweeps): from CELERY_BEAT_SCHEDULE."""
    intervals = {}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        schedule = entry["schedule"]
        if isinstance(schedule, timedelta):
            intervals[entry["task"]] = schedule.total_seconds()
        elif isinstance(schedule, int | float):
            intervals[entry["task"]] = float(schedule)
        elif getattr(schedule, "run_every", None) is not None:
            intervals[entry["task"]] = schedule.run_every.total_seconds()
    return intervals


def sweep_started(*, task_id: str | None, name: str | None) -> None:
    if task_id and name in sweep_intervals():
        _started[task_id] = time.monotonic()


def sweep_finished(*, task_id: str | None, name: str | None, state: str | None) -> None:
    """Record a sweep's duration and end time when it succeeded; a failed one leaves the last success standing."""
    started = _started.pop(task_id, None) if task_id else None
    if started is None or state != "SUCCESS":
        return
    value = json.dumps({"duration": time.monotonic() - started, "finished": time.time()})
    try:
        redis_client(timeout=1.0).hset(SWEEPS_KEY, name, value)
    except redis.RedisError:
        pass  # instrumentation: never fail the task over it


def _queue_depths(client: redis.Redis) -> dict[str, int]:
    names = [queue.name for queue in settings.CELERY_TASK_QUEUES]
    pipe = client.pipeline(transaction=False)
    for name in names:
        for key in [name, *(f"{name}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS)]:
            pipe.llen(key)
    lengths = pipe.execute()
    per = 1 + len(PRIORITY_STEPS)
    return {name: sum(lengths[i * per : (i + 1) * per]) for i, name in enumerate(names)}


def outbox_backlog() -> dict:
    """The outbox's unsent events: how many (``n``) and the oldest one's ``created_at`` (None when there are none)."""
    return Event.objects.filter(sent_at__isnull=True).aggregate(n=Count("pk"), oldest=Min("created_at"))


class HealthCollector:
    def collect(self):
        now = timezone.now()
        outbox = outbox_backlog()
        yield GaugeMetricFamily(
            "lockstep_outbox_unsent", "Outbox events not yet relayed to the channel layer", value=outbox["n"]
        )
        yield GaugeMetricFamily(
            "lockstep_outbox_oldest_unsent_seconds",
            "Age of the oldest unsent outbox event (0: none)",
            value=(now - outbox["oldest"]).total_seconds() if outbox["oldest"] else 0.0,
        )
        intervals = sweep_intervals()
        interval = GaugeMetricFamily(
            "lockstep_sweep_interval_seconds", "How often beat schedules each sweep", labels=["task"]
        )
        for name, seconds in sorted(intervals.items()):
            interval.add_metric([name], seconds)
        yield interval

        try:
            client = redis_client(url=settings.CELERY_BROKER_URL)
            depths = _queue_depths(client)
            unacked = client.hlen("unacked")
            state = (
                redis_client()
            )  # REDIS_URL: heartbeats and sweep timings (the broker may be another Redis)
            beats = read_heartbeats(state)
            sweeps = state.hgetall(SWEEPS_KEY)
        except (redis.RedisError, ValueError):
            yield GaugeMetricFamily(
                "lockstep_redis_up", "Whether this process reached Redis during the scrape", value=0
            )
            return
        yield GaugeMetricFamily(
            "lockstep_redis_up", "Whether this process reached Redis during the scrape", value=1
        )

        depth = GaugeMetricFamily(
            "lockstep_queue_depth", "Celery tasks waiting on each queue", labels=["queue"]
        )
        for name, n in depths.items():
            depth.add_metric([name], n)
        yield depth
        yield GaugeMetricFamily(
            "lockstep_queue_unacked", "Celery tasks taken by a worker and not yet acknowledged", value=unacked
        )

        count = GaugeMetricFamily(
            "lockstep_heartbeats", "Workers and beats with a live heartbeat", labels=["role"]
        )
        age = GaugeMetricFamily(
            "lockstep_heartbeat_age_seconds", "Age of each live heartbeat", labels=["role", "name"]
        )
        for role in ROLES:
            count.add_metric([role], sum(1 for beat in beats if beat["role"] == role))
        for beat in beats:
            age.add_metric([beat["role"], beat["name"]], max(0.0, beat["age_s"]))
        yield count
        yield age

        duration = GaugeMetricFamily(
            "lockstep_sweep_duration_seconds",
            "How long each sweep's last successful run took",
            labels=["task"],
        )
        finished = GaugeMetricFamily(
            "lockstep_sweep_last_success_timestamp_seconds",
            "When each sweep last ended successfully (Unix time)",
            labels=["task"],
        )
        for raw_name, raw in sorted(sweeps.items()):
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            try:
                entry = json.loads(raw)
                duration.add_metric([name], float(entry["duration"]))
                finished.add_metric([name], float(entry["finished"]))
            except (ValueError, KeyError, TypeError):
                continue
        yield duration
        yield finished
