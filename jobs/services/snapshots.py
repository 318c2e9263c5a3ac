"""Platform snapshots of running protected jobs: taken through the driver, finished by beat."""

from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.drivers import DriverError, driver_for
from jobs.choices import JobState, SnapshotReason, SnapshotState
from jobs.models import Job, JobSnapshot
from jobs.placement import immediate_constraints
from jobs.services.common import job_topics, protection_of


def _publish(snapshot: JobSnapshot, kind: str) -> None:
    events.publish(job_topics(snapshot.job), kind,
                   {"snapshot": snapshot.pk, "job": snapshot.job_id, "state": snapshot.state, "iteration": snapshot.iteration,
                    "reason": snapshot.reason, "started_at": snapshot.started_at.isoformat(),
                    "ended_at": snapshot.ended_at.isoformat() if snapshot.ended_at else None,
                    "seconds": snapshot.seconds, "summary": f"snapshot {snapshot.state}"},
                   url=f"/api/v1/jobs/{snapshot.job_id}/snapshots/")


@transaction.atomic
def snapshot_take(*, actor, job: Job, reason: str = SnapshotReason.OPERATOR) -> JobSnapshot:
    """Start a snapshot of every worker of a running, protected job (no change to model code). It takes
    seconds, growing with the job's size; beat marks it done."""
    immediate_constraints()
    job = Job.objects.select_for_update(of=("self",), no_key=True).select_related("cluster").get(pk=job.pk)
    if job.state != JobState.RUNNING:
        raise ServiceError(f"job {job.pk} is {job.state}; only a running job can be snapshotted", status=409)
    protection = protection_of(job.cluster)
    if not protection.protected:
        raise ServiceError(f"job {job.pk} is not protected: {protection.reason}", status=409)
    if job.snapshots.filter(state=SnapshotState.RUNNING).exists():
        raise ServiceError("a snapshot of this job is already running", status=409)
    try:
        result = driver_for(job.cluster).snapshot(job.ref, job.gpus)
    except DriverError as error:
        raise ServiceError(f"the cluster refused: {error}", status=503 if error.transient else 409) from error
    now = timezone.now()
    snapshot = JobSnapshot.objects.create(job=job, reason=reason, iteration=job.iteration_now(now), handle=result.handle,
                                          started_at=now, done_at=result.done_at)
    audit_record(actor=actor, action="job.snapshot", target=job, tenant_id=job.tenant_id, changes={"reason": reason})
    _publish(snapshot, "snapshot.started")
    return snapshot


def snapshots_advance() -> int:
    """Finish the snapshots whose driver operation finished; returns how many."""
    finished = 0
    due = JobSnapshot.objects.filter(state=SnapshotState.RUNNING, done_at__lte=timezone.now()).values_list("pk", flat=True)
    for snapshot_id in list(due[:200]):
        with transaction.atomic():
            immediate_constraints()
            snapshot = (JobSnapshot.objects.select_for_update(skip_locked=True, of=("self",), no_key=True)
                        .select_related("job__cluster").filter(pk=snapshot_id).first())
            if snapshot is None or snapshot.state != SnapshotState.RUNNING:
                continue
            status = driver_for(snapshot.job.cluster).operation_status(snapshot.handle)
            if status == "running":
                continue
            snapshot.state = SnapshotState.SUCCEEDED if status == "succeeded" else SnapshotState.FAILED
            snapshot.ended_at = timezone.now()
            snapshot.save(update_fields=["state", "ended_at"])
            _publish(snapshot, f"snapshot.{snapshot.state}")
            finished += 1
    return finished


def snapshot_schedule() -> int:
    """Take the snapshots a blueprint policy schedules (``{"snapshot": {"interval_minutes": N}}``) for running
    protected jobs whose last snapshot is older than that. Returns how many started."""
    started = 0
    jobs = Job.objects.filter(state=JobState.RUNNING, cluster__blueprint_version__isnull=False).select_related(
        "cluster__blueprint_version")
    for job in jobs[:1000]:
        policy = job.cluster.blueprint_version.effective_policy().get("snapshot") or {}
        minutes = policy.get("interval_minutes")
        if not minutes:
            continue
        last = job.snapshots.order_by("-started_at").first()
        if last and (timezone.now() - last.started_at).total_seconds() < float(minutes) * 60:
            continue
        try:
            snapshot_take(actor=None, job=job, reason=SnapshotReason.SCHEDULE)
            started += 1
        except ServiceError:
            continue
    return started
