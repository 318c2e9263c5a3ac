from celery import shared_task

from simulator.services.whatifs import whatif_execute, whatif_sweep


@shared_task(name="simulator.whatif", ignore_result=True, time_limit=600, soft_time_limit=570)
def whatif_task(run_id: int) -> str:
    return whatif_execute(run_id=run_id)


@shared_task(name="simulator.whatif_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def whatif_sweep_task() -> int:
    return whatif_sweep()


@shared_task(name="simulator.scenarios", ignore_result=True, time_limit=60, soft_time_limit=50)
def scenarios_task() -> int:
    from simulator.services.scenarios import scenarios_advance

    return scenarios_advance()
