"""Jobs: submit (simulated clusters place the job; real launchers name their nodes), cancel, progress."""

import math

from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record, audit_record_sampled
from controlplane.context import current as request_context
from controlplane.errors import ServiceError
from fleet.choices import DriverName, GPUHealth, NodeState
from fleet.models import Cluster, Node
from jobs.choices import ACTIVE_ACTION_STATES, ACTIVE_JOB_STATES, JobPhaseKind, JobState
from jobs.models import Job, JobAllocation, JobToken, RecoveryAction
from jobs.placement import busy_node_ids, immediate_constraints, lock_cluster, lock_nodes
from jobs.services.phases import phase_end, phase_start, record_progress
from jobs.services.publishing import job_payload, publish_job
from jobs.services.resumed import restart_resumed
from tenancy.services import token_issue

NO_SUCH_CLUSTER = "no such cluster for this tenant"
# Progress reports come every few seconds: the audit trail keeps the first of each reporter (a job token, a user)
# per job in this window, and every report that moves the job back (docs/security.md, the audit trail).
PROGRESS_AUDIT_SECONDS = 3600


def job_token_create(*, job: Job) -> str:
    """A new job token (shown once): ``lsj_<prefix>_<secret>``; only its digest is stored."""
    _, raw = token_issue(model=JobToken, job=job)
    return raw


def _pick_nodes(cluster: Cluster, nodes_needed: int, gpu_model: str | None) -> list[Node]:
    busy = busy_node_ids(cluster.pk)
    rows = (
        Node.objects.filter(cluster=cluster, state=NodeState.READY)
        .exclude(pk__in=busy)
        .exclude(gpus__health__in=[GPUHealth.FAILED, GPUHealth.DEGRADED])
        .order_by("leaf_switch", "hostname")
    )
    if gpu_model:
        rows = rows.filter(gpu_model=gpu_model)
    picked = list(rows.distinct()[:nodes_needed])
    if len(picked) < nodes_needed:
        # How many are free is other tenants' business on a shared cluster (issue 54): say only what is missing.
        raise ServiceError(
            f"cluster {cluster.name} has too few free ready nodes: the job needs {nodes_needed} "
            f"node{'s' if nodes_needed != 1 else ''} for its GPUs",
            field="gpus",
            status=409,
        )
    return picked


def _registered_nodes(cluster: Cluster, hostnames: list[str]) -> list[Node]:
    """The nodes a launcher names for a real job, row-locked: each must exist on the cluster and hold no live
    allocation of another job (a job registered on hosts it does not run on would see their faults and compete
    for their spares). The caller holds the cluster's row lock, so two registrations cannot both take a host."""
    if cluster.driver == DriverName.SIMULATED:
        raise ServiceError(
            "a simulated cluster places its jobs itself: leave hostnames out", field="hostnames"
        )
    ids = list(Node.objects.filter(cluster=cluster, hostname__in=hostnames).values_list("pk", flat=True))
    if len(ids) != len(set(hostnames)):
        raise ServiceError("unknown host names on this cluster", field="hostnames")
    order = {name: position for position, name in enumerate(dict.fromkeys(hostnames))}
    nodes = sorted(lock_nodes(ids).values(), key=lambda node: order[node.hostname])
    held = sorted(
        JobAllocation.objects.filter(node_id__in=ids, released_at__isnull=True)
        .values_list("node__hostname", flat=True)
        .distinct()
    )
    if held:
        raise ServiceError(
            f"hosts held by another job: {', '.join(held[:20])}", field="hostnames", status=409
        )
    return nodes


@transaction.atomic
def job_submit(
    *,
    actor,
    tenant,
    cluster: Cluster,
    name: str,
    gpus: int,
    gpus_per_node: int = 8,
    seconds_per_iteration: float = 1.0,
    checkpoint_interval: int = 1000,
    total_iterations: int | None = None,
    hostnames: list[str] | None = None,
    gpu_model: str | None = None,
) -> tuple[Job, str]:
    """Start a job: on a simulated cluster Lockstep places it on free ready nodes; a job on a real cluster is
    registered by its launcher with the hostnames it runs on. Returns (job, job token shown once)."""
    if gpus < 1 or gpus_per_node < 1:
        raise ServiceError("a job needs at least one GPU", field="gpus")
    if seconds_per_iteration <= 0:
        raise ServiceError("must be positive", field="seconds_per_iteration")
    if cluster.dedicated_tenant_id not in (None, tenant.pk):
        # The answer for a cluster that does not exist, so that it says nothing of another tenant's (issue 54).
        raise ServiceError(NO_SUCH_CLUSTER, field="cluster")
    cluster = lock_cluster(cluster.pk)
    if hostnames:
        nodes = _registered_nodes(cluster, hostnames)
        per_node = math.ceil(gpus / len(nodes))
    else:
        if cluster.driver != DriverName.SIMULATED:
            raise ServiceError("on a real cluster, name the hosts the job runs on", field="hostnames")
        per_node = min(gpus, gpus_per_node)
        nodes = _pick_nodes(cluster, math.ceil(gpus / per_node), gpu_model)
    now = timezone.now()
    job = Job.objects.create(
        tenant=tenant,
        cluster=cluster,
        name=name,
        gpus=gpus,
        simulated=not hostnames,
        reports_progress=bool(hostnames),
        state=JobState.RUNNING,
        seconds_per_iteration=seconds_per_iteration,
        checkpoint_interval=checkpoint_interval,
        total_iterations=total_iterations,
        iteration_at=now,
        started_at=now,
        submitted_by=actor if getattr(actor, "pk", None) else None,
    )
    rank, left = 0, gpus
    allocations = []
    for node in nodes:
        count = min(per_node, left)
        allocations.append(
            JobAllocation(
                job=job, node=node, gpu_indices=list(range(count)), rank_start=rank, rank_end=rank + count - 1
            )
        )
        rank, left = rank + count, left - count
    JobAllocation.objects.bulk_create(allocations)
    phase_start(job, JobPhaseKind.RUNNING, reason="submitted", at=now)
    record_progress(job, at=now, iteration=0)
    raw = job_token_create(job=job)
    audit_record(
        actor=actor,
        action="job.submit",
        target=job,
        tenant_id=tenant.pk,
        changes={"gpus": gpus, "cluster": cluster.name, "nodes": len(nodes)},
    )
    publish_job(job, "job.submitted")
    return job, raw


def _progress_audit(job: Job, *, actor, iteration: int, checkpoint: bool) -> None:
    """The audit entry of a progress report: the first of its reporter in PROGRESS_AUDIT_SECONDS, and any that
    moves the job back (a restart from its checkpoint, or a report that is not the job's own)."""
    reporter = request_context().token_prefix or (
        f"user-{actor.pk}" if getattr(actor, "pk", None) else "system"
    )
    back = iteration < job.iteration
    audit_record_sampled(
        key=f"job-progress:{job.pk}:{reporter}",
        seconds=PROGRESS_AUDIT_SECONDS,
        always=back,
        actor=actor,
        action="job.progress",
        target=job,
        tenant_id=job.tenant_id,
        changes={"iteration": [job.iteration, iteration], "checkpoint": checkpoint, "back": back},
    )


def _stop(job: Job, state: str, *, reason: str) -> str:
    """End a job in ``state``: its GPUs are released, its recoveries under way end failed with ``reason``."""
    from jobs.services.actions import fail_many

    now = timezone.now()
    job.iteration, job.iteration_at = job.iteration_now(now), now
    old, job.state, job.ended_at = job.state, state, now
    job.save(update_fields=["iteration", "iteration_at", "state", "ended_at"])
    JobAllocation.objects.filter(job=job, released_at__isnull=True).update(released_at=now)
    active = list(
        RecoveryAction.objects.filter(job=job, state__in=ACTIVE_ACTION_STATES).select_related("job")
    )
    fail_many(active, {action.pk: reason for action in active})
    phase_end(job, at=now)
    record_progress(job, at=now, iteration=job.iteration)
    return old


@transaction.atomic
def job_cancel(*, actor, job: Job) -> Job:
    """Stop a job: its GPUs are released, its recoveries under way are dropped."""
    job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
    if job.state not in ACTIVE_JOB_STATES:
        raise ServiceError(f"job {job.pk} is already {job.state}", status=409)
    old = _stop(job, JobState.CANCELLED, reason="the job was cancelled")
    audit_record(
        actor=actor,
        action="job.cancel",
        target=job,
        tenant_id=job.tenant_id,
        changes={"state": [old, job.state]},
    )
    publish_job(job, "job.state")
    return job


def job_fail(*, job: Job, reason: str) -> Job:
    """Recovery gave up on a job (its restarts kept failing): it is Failed, with the reason on its timeline, and a
    ``job.state`` event that the notifications send on. The caller holds the job's row lock."""
    job.state_reason = reason[:300]
    job.save(update_fields=["state_reason"])
    old = _stop(job, JobState.FAILED, reason=f"the job failed: {reason}")
    audit_record(
        actor=None,
        action="job.fail",
        target=job,
        tenant_id=job.tenant_id,
        changes={"state": [old, job.state], "reason": reason},
    )
    publish_job(job, "job.state", reason=reason)
    return job


@transaction.atomic
def job_progress(
    *, job: Job, iteration: int, step_seconds: float | None = None, checkpoint: bool = False, actor=None
) -> Job:
    """A job reports its own progress: the iteration it reached, its step time, and whether it just saved a
    checkpoint. The planner and the ledger then work from the job's own figures."""
    if iteration < 0:
        raise ServiceError("must not be negative", field="iteration")
    if step_seconds is not None and not 0 < step_seconds < 86400:
        raise ServiceError("must be between 0 and 86400", field="step_seconds")
    immediate_constraints()
    job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=job.pk)
    if job.state not in ACTIVE_JOB_STATES:
        raise ServiceError(f"job {job.pk} is {job.state}", status=409)
    now = timezone.now()
    _progress_audit(job, actor=actor, iteration=iteration, checkpoint=checkpoint)
    job.iteration, job.iteration_at = iteration, now
    if step_seconds:
        # A moving average, so one slow step does not swing the planner's estimates.
        job.seconds_per_iteration = (
            0.8 * job.seconds_per_iteration + 0.2 * step_seconds if job.progress.exists() else step_seconds
        )
    if checkpoint:
        job.last_checkpoint_iteration, job.last_checkpoint_at = iteration, now
    # Once a job reports, its own figures replace the clock; its kind (``simulated``) stays what it was.
    job.reports_progress = True
    job.save(
        update_fields=[
            "iteration",
            "iteration_at",
            "seconds_per_iteration",
            "last_checkpoint_iteration",
            "last_checkpoint_at",
            "reports_progress",
        ]
    )
    record_progress(job, at=now, iteration=iteration, step_seconds=step_seconds, checkpoint=checkpoint)
    # The first step after a restart Lockstep carried out ends its pause, and measures the restart baseline.
    restart_resumed(job=job, at=now, iteration=iteration)
    # Progress is frequent: it goes to the job's own topic only.
    events.publish(
        [events.topic("job", job.pk)],
        "job.progress",
        job_payload(job, checkpoint=checkpoint, step_seconds=step_seconds),
        url=f"/api/v1/jobs/{job.pk}/",
    )
    return job
