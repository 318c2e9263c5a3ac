from celery import shared_task

from telemetry.services.retention import telemetry_prune


@shared_task(name="telemetry.retention_prune", ignore_result=True, time_limit=900, soft_time_limit=870)
def telemetry_prune_task() -> dict:
    return telemetry_prune()


@shared_task(name="telemetry.notifications", ignore_result=True, time_limit=300, soft_time_limit=280)
def notifications_task() -> dict:
    """Dispatch new notices and post what is due (beat, every few seconds; safe to run twice)."""
    from telemetry.services.notifications import notifications_deliver, notifications_dispatch

    return {"dispatched": notifications_dispatch(), **notifications_deliver()}


@shared_task(name="telemetry.risk_sweep", ignore_result=True, time_limit=120, soft_time_limit=110)
def risk_sweep_task() -> int:
    """Score every node and raise or judge predictions (beat; safe to run twice: an open prediction is not
    raised again)."""
    from telemetry.services.prediction import risk_sweep

    return len(risk_sweep().predictions)
