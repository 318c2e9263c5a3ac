"""Celery with a real broker and real worker and beat processes."""

import subprocess
import time

import pytest
import redis
from django.conf import settings

from controlplane import events
from controlplane.celery import app
from controlplane.models import Event
from controlplane.tasks import ping_task
from tests.support.processes import VENV_BIN, celery_worker, child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_celery_is_configured_for_a_control_plane():
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.broker_transport_options["visibility_timeout"] < 3600
    assert conf.task_time_limit and conf.task_soft_time_limit < conf.task_time_limit
    for entry in conf.beat_schedule.values():
        assert entry["schedule"].total_seconds() <= 3600


def test_task_round_trip_through_a_real_worker(tmp_path, client, users):
    with celery_worker(tmp_path) as worker:
        result = ping_task.delay("hello")
        assert result.get(timeout=30) == {"echo": "hello", "database": 1}
        client.force_login(users["operator"])  # worker names are for signed-in callers
        body = client.get("/readyz").json()
        assert body["workers"]["ok"] is True
        assert any(worker.node_name in beat["name"] for beat in body["workers"]["seen"])


def test_beat_drives_the_outbox_sweep_through_a_worker(tmp_path, client):
    """An event whose relay never ran (a killed process) is sent by beat's sweep via a worker."""
    events.publish(["fleet"], "orphaned.event")  # autocommit, relay hook included; forget it was sent
    Event.objects.update(sent_at=None)
    with celery_worker(tmp_path):
        log = (tmp_path / "beat.log").open("w")
        beat = subprocess.Popen(
            [
                str(VENV_BIN / "celery"),
                "-A",
                "controlplane",
                "beat",
                "--loglevel=info",
                "--schedule",
                str(tmp_path / "beat-schedule"),
            ],
            env=child_env(OUTBOX_SWEEP_SECONDS=1),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=settings.BASE_DIR,
        )
        try:
            wait_for(
                lambda: not Event.objects.filter(sent_at__isnull=True).exists(),
                40,
                what=f"the beat-driven sweep ({(tmp_path / 'beat.log').read_text()[-500:]})",
            )
            wait_for(lambda: client.get("/readyz").json()["beat"]["ok"], 10, what="beat heartbeat")
        finally:
            beat.terminate()
            beat.wait(15)
    client_redis = redis.Redis.from_url(settings.REDIS_URL)
    time.sleep(0)
    assert client_redis.ping()
