"""Beat-driven upkeep of the shared machinery: the outbox sweep, retention, and a ping for health checks."""

from celery import shared_task

from controlplane import events
from controlplane.audit import audit_prune


@shared_task(name="controlplane.outbox_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def outbox_sweep_task() -> int:
    return events.outbox_sweep()


@shared_task(name="controlplane.retention_prune", ignore_result=True, time_limit=600, soft_time_limit=570)
def retention_prune_task() -> dict:
    return {"events": events.events_prune(), "audit": audit_prune()}


@shared_task(name="controlplane.ping", ignore_result=False, time_limit=10, soft_time_limit=8)
def ping_task(value: str = "ping") -> dict:
    """Round trip through the broker, a worker and the database: proves the stack is wired."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        one = cursor.fetchone()[0]
    return {"echo": value, "database": one}
