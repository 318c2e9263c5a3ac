"""The Celery application: `celery -A controlplane worker` and `celery -A controlplane beat`."""

import os

from celery import Celery
from celery.signals import beat_init, task_postrun, task_prerun, worker_ready, worker_shutdown

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


@task_prerun.connect
@task_postrun.connect
def _database_connections_checked(**_):
    """Workers keep their database connection across tasks (CELERY_DB_REUSE_MAX), so treat each task as Django
    treats a request: drop a connection that errored or outlived CONN_MAX_AGE, and have the next query check the
    connection first (CONN_HEALTH_CHECKS), so one broken by a database restart is replaced, not reused."""
    from django.db import close_old_connections

    close_old_connections()


@task_prerun.connect
def _sweep_started(task_id=None, task=None, **_):
    from controlplane.metrics import sweep_started

    sweep_started(task_id=task_id, name=getattr(task, "name", None))


@task_postrun.connect
def _sweep_finished(task_id=None, task=None, state=None, **_):
    """Each sweep's duration for /metrics (lockstep_sweep_duration_seconds)."""
    from controlplane.metrics import sweep_finished

    sweep_finished(task_id=task_id, name=getattr(task, "name", None), state=state)
