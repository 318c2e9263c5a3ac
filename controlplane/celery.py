"""The Celery application: `celery -A controlplane worker` and `celery -A controlplane beat`."""

import os

from celery import Celery
from celery.signals import beat_init, worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("lockstep")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Any number of beats may run; only the holder of a Redis lock schedules (controlplane/beat.py).
app.conf.beat_scheduler = "controlplane.beat:LockedScheduler"
app.autodiscover_tasks()


@worker_ready.connect
def _worker_heartbeat(sender=None, **_):
    from controlplane.heartbeat import start_heartbeat

    start_heartbeat("worker", getattr(sender, "hostname", None) or "worker")


@worker_shutdown.connect
def _worker_heartbeat_stop(**_):
    from controlplane.heartbeat import stop_heartbeat

    stop_heartbeat()


@beat_init.connect
def _beat_heartbeat(sender=None, **_):
    from controlplane.heartbeat import start_heartbeat

    start_heartbeat("beat", "beat")
