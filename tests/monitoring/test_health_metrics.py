"""Lockstep's own health on /metrics, from where it lives: undecided faults, the outbox, the broker's queues, the
heartbeats and the sweeps' timings; Redis away leaves the scrape answering."""

import time
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.heartbeat import PREFIX, beat_once
from controlplane.metrics import SWEEPS_KEY, sweep_finished, sweep_started
from controlplane.models import Event
from controlplane.queueing import queue
from jobs.models import FaultEvent
from jobs.services.faults import fault_ingest
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(SWEEPS_KEY, *client.scan_iter(f"{PREFIX}*"))
    yield client
    client.delete(SWEEPS_KEY)


def scrape(api, users) -> dict[tuple[str, tuple], float]:
    api.as_token(users["operator"], "read")
    response = api.get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def test_undecided_faults_and_unsent_events_with_their_ages(api, users, client_redis):
    metrics = scrape(api, users)
    assert metrics[("lockstep_faults_waiting", ())] == 0
    assert metrics[("lockstep_faults_waiting_oldest_seconds", ())] == 0
    node = make_node(make_cluster())
    # Stored, and (no commit in this test) never handed to a worker: new, and its event unsent.
    fault, _ = fault_ingest(source="api", kind="nic_down", node=node, nic_name="mlx5_1")
    FaultEvent.objects.filter(pk=fault.pk).update(received_at=timezone.now() - timedelta(seconds=90))
    Event.objects.filter(sent_at__isnull=True).update(created_at=timezone.now() - timedelta(seconds=120))
    unsent = Event.objects.filter(sent_at__isnull=True).count()
    assert unsent >= 1
    metrics = scrape(api, users)
    assert metrics[("lockstep_faults_waiting", ())] == 1
    assert 89 < metrics[("lockstep_faults_waiting_oldest_seconds", ())] < 150
    assert metrics[("lockstep_outbox_unsent", ())] == unsent
    assert 119 < metrics[("lockstep_outbox_oldest_unsent_seconds", ())] < 180


def test_queue_depth_is_the_brokers_own(api, users, client_redis):
    from jobs.tasks import fault_handle_task
    from telemetry.tasks import risk_sweep_task

    def depths() -> dict[str, float]:
        metrics = scrape(api, users)
        return {
            q: metrics[("lockstep_queue_depth", (("queue", q),))] for q in ("faults", "celery", "analytics")
        }

    # The broker is shared with the rest of the suite: what earlier tests left queued is counted too, so the
    # figure must move by exactly what this test queues.
    before = depths()
    for fault_id in (1, 2, 3):
        assert queue(fault_handle_task, fault_id)  # no worker runs in this test: they wait on `faults`
    assert queue(risk_sweep_task)
    after = depths()
    assert after["faults"] - before["faults"] == 3
    assert after["analytics"] - before["analytics"] == 1
    assert after["celery"] == before["celery"]


def test_heartbeats_by_role(api, users, client_redis):
    metrics = scrape(api, users)
    assert metrics[("lockstep_heartbeats", (("role", "worker"),))] == 0
    assert metrics[("lockstep_heartbeats", (("role", "beat"),))] == 0
    beat_once("worker", "celery@a")
    beat_once("worker", "celery@b")
    beat_once("beat", "beat")
    metrics = scrape(api, users)
    assert metrics[("lockstep_heartbeats", (("role", "worker"),))] == 2
    assert metrics[("lockstep_heartbeats", (("role", "beat"),))] == 1
    assert 0 <= metrics[("lockstep_heartbeat_age_seconds", (("name", "celery@a"), ("role", "worker")))] < 5


def test_sweep_timings_come_from_successful_runs_of_scheduled_tasks(api, users, client_redis):
    began = time.monotonic()
    sweep_started(task_id="t1", name="fleet.drift_sweep")
    time.sleep(0.05)
    sweep_finished(task_id="t1", name="fleet.drift_sweep", state="SUCCESS")
    took = time.monotonic() - began  # the most the timing can say, however loaded the machine
    sweep_started(task_id="t2", name="jobs.fault_sweep")
    sweep_finished(task_id="t2", name="jobs.fault_sweep", state="FAILURE")  # a failure leaves no timing
    sweep_started(task_id="t3", name="jobs.fault_handle")  # not a sweep: not recorded
    sweep_finished(task_id="t3", name="jobs.fault_handle", state="SUCCESS")
    metrics = scrape(api, users)
    drift = (("task", "fleet.drift_sweep"),)
    assert 0.05 <= metrics[("lockstep_sweep_duration_seconds", drift)] <= took
    assert abs(metrics[("lockstep_sweep_last_success_timestamp_seconds", drift)] - time.time()) < 5
    assert metrics[("lockstep_sweep_interval_seconds", drift)] == settings.DRIFT_SWEEP_SECONDS
    assert ("lockstep_sweep_duration_seconds", (("task", "jobs.fault_sweep"),)) not in metrics
    assert ("lockstep_sweep_interval_seconds", (("task", "jobs.fault_handle"),)) not in metrics


def test_redis_away_is_reported_and_the_scrape_still_answers(api, users, client_redis, settings):
    assert scrape(api, users)[("lockstep_redis_up", ())] == 1
    from tests.support.processes import free_port

    away = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_URL, settings.CELERY_BROKER_URL, settings.READYZ_TIMEOUT = away, away, 0.5
    metrics = scrape(api, users)
    assert metrics[("lockstep_redis_up", ())] == 0
    assert ("lockstep_faults_waiting", ()) in metrics and not any(
        name == "lockstep_queue_depth" for name, _ in metrics
    )
