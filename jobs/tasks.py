"""Thin Celery tasks: each takes ids, calls one service, and can run twice with the same result."""

from celery import shared_task

from jobs.services import faults as fault_services


@shared_task(name="jobs.fault_handle", ignore_result=True, time_limit=60, soft_time_limit=50)
def fault_handle_task(fault_id: int, cluster_id: int | None = None) -> list[int]:
    return fault_services.fault_handle(fault_id=fault_id, cluster_id=cluster_id)


@shared_task(name="jobs.fault_sweep", ignore_result=True, time_limit=30, soft_time_limit=25)
def fault_sweep_task() -> int:
    return fault_services.fault_sweep()


@shared_task(name="jobs.recovery_advance", ignore_result=True, time_limit=60, soft_time_limit=50)
def recovery_advance_task() -> dict:
    from jobs.services.advance import recovery_advance

    return recovery_advance()


@shared_task(name="jobs.snapshot_schedule", ignore_result=True, time_limit=60, soft_time_limit=50)
def snapshot_schedule_task() -> int:
    from jobs.services.snapshots import snapshot_schedule

    return snapshot_schedule()


@shared_task(name="jobs.silence_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def silence_sweep_task() -> dict:
    from jobs.services.silence import silence_sweep

    return silence_sweep()


@shared_task(name="jobs.links_fail_back", ignore_result=True, time_limit=60, soft_time_limit=50)
def links_fail_back_task() -> int:
    from jobs.services.links import links_fail_back

    return links_fail_back()


@shared_task(name="jobs.slurm_sync", ignore_result=True, time_limit=60, soft_time_limit=50)
def slurm_sync_task() -> list[dict]:
    from jobs.services.slurm_jobs import slurm_sync_all

    return slurm_sync_all()


@shared_task(name="jobs.drain_request", ignore_result=True, time_limit=60, soft_time_limit=50)
def drain_request_task(node_ids: list[int]) -> list[int]:
    from jobs.services.drain import drain_request

    return drain_request(node_ids=node_ids)


@shared_task(name="jobs.drains_advance", ignore_result=True, time_limit=60, soft_time_limit=50)
def drains_advance_task() -> dict:
    from jobs.services.drain import drains_advance

    return drains_advance()
