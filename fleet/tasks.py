"""Fleet tasks: thin, id-taking, level-triggered callers of fleet services (see DESIGN: Tasks)."""

from celery import shared_task

from fleet.choices import RolloutState


@shared_task(name="fleet.rollout_progress", ignore_result=True, time_limit=300, soft_time_limit=280)
def rollout_progress_task(rollout_id: int) -> str:
    """Move one rollout one step; a second copy finds the rollout locked or already moved and does nothing."""
    from fleet.services.rollout_steps import rollout_step

    return rollout_step(rollout_id=rollout_id)


@shared_task(name="fleet.rollout_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def rollout_sweep_task() -> int:
    """Beat: queue a step for every pending or running rollout (and every rolled-back one still putting node
    software back), so a lost message never strands one."""
    from django.db.models import Q

    from fleet.models import Rollout

    ids = list(
        Rollout.objects.filter(
            Q(state__in=[RolloutState.PENDING, RolloutState.RUNNING])
            | Q(state=RolloutState.ROLLED_BACK, clusters__reverting=True)
        )
        .distinct()
        .values_list("pk", flat=True)
    )
    for rollout_id in ids:
        rollout_progress_task.delay(rollout_id)
    return len(ids)


@shared_task(name="fleet.drift_sweep", ignore_result=True, time_limit=600, soft_time_limit=570)
def drift_sweep_task(cluster_ids: list[int] | None = None) -> dict:
    """Beat (every DRIFT_SWEEP_SECONDS) and on demand: observe, compare, open/resolve findings, correct."""
    from fleet.services.drift import drift_sweep

    return drift_sweep(cluster_ids=cluster_ids).as_dict()


@shared_task(name="fleet.cluster_reconcile", ignore_result=True, time_limit=300, soft_time_limit=280)
def cluster_reconcile_task(cluster_id: int) -> dict | None:
    """Bring one cluster to its desired version (after an assignment); gone or unassigned clusters are skipped."""
    from controlplane.errors import ServiceError
    from fleet.models import Cluster
    from fleet.services.clusters import cluster_reconcile

    cluster = Cluster.objects.filter(pk=cluster_id, blueprint_version__isnull=False).first()
    if cluster is None:
        return None
    try:
        return cluster_reconcile(actor=None, cluster=cluster)
    except ServiceError as error:
        return {"error": error.detail}


@shared_task(name="fleet.blueprint_source_sync", ignore_result=True, time_limit=300, soft_time_limit=280)
def blueprint_source_sync_task(source_id: int) -> dict:
    """Poll one blueprint source: each new commit that changed its document becomes a draft version."""
    from fleet.services.sources import source_sync

    return source_sync(source_id=source_id)


@shared_task(name="fleet.blueprint_source_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def blueprint_source_sweep_task() -> int:
    """Beat: queue a poll of every blueprint source whose poll is due (a lost message is found again here)."""
    from controlplane.queueing import queue
    from fleet.services.sources import source_due

    ids = source_due()
    for source_id in ids:
        queue(blueprint_source_sync_task, source_id)
    return len(ids)
