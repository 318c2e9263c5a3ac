from celery import shared_task

from telemetry.services.retention import telemetry_prune


@shared_task(name="telemetry.retention_prune", ignore_result=True, time_limit=900, soft_time_limit=870)
def telemetry_prune_task() -> dict:
    return telemetry_prune()
