"""Snapshots of running jobs: platform snapshots taken through the driver and finished by beat, and the
restore points, restores and hangs the job's own protection runtime (``lockstep_agent.protect``) reports."""

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max, Sum
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.drivers import DriverError, driver_for
from jobs.choices import (
    ACTIVE_JOB_STATES,
    RESTORE_POINT_KINDS,
    ActionKind,
    ActionState,
    JobState,
    SavingState,
    SnapshotKind,
    SnapshotReason,
    SnapshotState,
)
from jobs.ledger import actual_gpu_hours, expected_saving
from jobs.models import Job, JobAllocation, JobProgress, JobSnapshot, RecoveryAction
from jobs.placement import immediate_constraints
from jobs.services.capabilities import protection_of
from jobs.services.publishing import job_topics, publish_action


def _summary(snapshot: JobSnapshot) -> str:
    if snapshot.kind == SnapshotKind.PLATFORM:
        return f"snapshot {snapshot.state}"
    if snapshot.kind == SnapshotKind.HANG:
        return f"hang at iteration {snapshot.iteration}: rank(s) {', '.join(map(str, snapshot.stalled_ranks)) or '?'}"
    return f"{snapshot.get_kind_display().lower()} at iteration {snapshot.iteration}"


def _publish(snapshot: JobSnapshot, kind: str) -> None:
    events.publish(
        job_topics(snapshot.job),
        kind,
        {
            "snapshot": snapshot.pk,
            "job": snapshot.job_id,
            "state": snapshot.state,
            "iteration": snapshot.iteration,
            "reason": snapshot.reason,
            "kind": snapshot.kind,
            "started_at": snapshot.started_at.isoformat(),
            "ended_at": snapshot.ended_at.isoformat() if snapshot.ended_at else None,
            "seconds": snapshot.seconds,
            "summary": _summary(snapshot),
        },
        url=f"/api/v1/jobs/{snapshot.job_id}/snapshots/",
    )


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
    snapshot = JobSnapshot.objects.create(
        job=job,
        reason=reason,
        iteration=job.iteration_now(now),
        handle=result.handle,
        started_at=now,
        done_at=result.done_at,
    )
    audit_record(
        actor=actor, action="job.snapshot", target=job, tenant_id=job.tenant_id, changes={"reason": reason}
    )
    _publish(snapshot, "snapshot.started")
    return snapshot


def snapshots_advance() -> int:
    """Finish the snapshots whose driver operation finished; returns how many."""
    finished = 0
    due = JobSnapshot.objects.filter(state=SnapshotState.RUNNING, done_at__lte=timezone.now()).values_list(
        "pk", flat=True
    )
    for snapshot_id in list(due[:200]):
        with transaction.atomic():
            immediate_constraints()
            snapshot = (
                JobSnapshot.objects.select_for_update(skip_locked=True, of=("self",), no_key=True)
                .select_related("job__cluster")
                .filter(pk=snapshot_id)
                .first()
            )
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
    jobs = Job.objects.filter(
        state=JobState.RUNNING, cluster__blueprint_version__isnull=False
    ).select_related("cluster__blueprint_version")
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


# Runtime reports that are worth an audit entry; plain restore points come every few seconds and are kept as
# their rows, like progress reports.
_AUDITED = (
    SnapshotKind.WRITE_THROUGH,
    SnapshotKind.RESTORE,
    SnapshotKind.DISK_FALLBACK,
    SnapshotKind.HANG,
    SnapshotKind.PEER_LOST,
    SnapshotKind.RANK_REPLACED,
)


@transaction.atomic
def snapshot_report(
    *,
    job: Job,
    kind: str,
    iteration: int,
    seconds: float | None = None,
    size_bytes: int | None = None,
    locations: list[dict] | None = None,
    stalled_ranks: list[int] | None = None,
    note: str = "",
    overhead_seconds: float | None = None,
    details: dict | None = None,
) -> JobSnapshot:
    """Record what the job's protection runtime reports with its job token: a restore point (``snapshot``,
    ``write_through``: usable by restore_from_snapshot), a ``restore`` or ``disk_fallback`` it performed, or a
    ``hang``. ``seconds`` is measured by the runtime; the row spans the ``seconds`` before now.
    ``overhead_seconds``: the training time its snapshots cost since its previous report (what the ledger books
    as snapshot overhead). ``details``: what else it reported (jobs.services.in_job: a lost peer opens or joins
    its node's incident, a replaced rank books its recovery, the standbys named are booked to the job)."""
    details = dict(details or {})
    note = note or str(details.get("reason") or "")[:300]  # a fallback says which, and why
    if kind == SnapshotKind.PLATFORM or kind not in SnapshotKind.values:
        raise ServiceError(f"{kind!r} is not a runtime report kind", status=400)
    job = Job.objects.get(pk=job.pk)
    if job.state not in ACTIVE_JOB_STATES:
        raise ServiceError(f"job {job.pk} is {job.state}; it takes no more reports", status=409)
    if job.total_iterations is not None and iteration > job.total_iterations:
        raise ServiceError(
            f"iteration {iteration} is past the job's {job.total_iterations} iterations", status=400
        )
    now = timezone.now()
    point = kind in RESTORE_POINT_KINDS
    snapshot = JobSnapshot.objects.create(
        job=job,
        kind=kind,
        reason=SnapshotReason.RUNTIME,
        iteration=iteration,
        state=SnapshotState.SUCCEEDED if point else SnapshotState.RECORDED,
        started_at=now - timedelta(seconds=seconds or 0),
        done_at=now,
        ended_at=now,
        size_bytes=size_bytes,
        locations=list(locations or []),
        stalled_ranks=list(stalled_ranks or []),
        note=note,
        overhead_seconds=overhead_seconds,
        details=details,
    )
    if kind in _AUDITED:
        _audit_report(job, snapshot, seconds)
    if kind == SnapshotKind.RESTORE and seconds is not None:
        # A measured in-memory restore: what the planner's restore_from_snapshot estimate is made of.
        from jobs.services.estimates import estimates_record

        estimates_record([(job.cluster_id, "restore_pause", float(seconds))])
    if kind == SnapshotKind.HANG:
        _hang_fault(job, snapshot)
    if details:
        from jobs.services.in_job import in_job_reported

        in_job_reported(job=job, report=snapshot)
    if kind in (SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK):
        restore_measured(job=job, report=snapshot)
    if kind == SnapshotKind.WRITE_THROUGH:
        from jobs.services.moves import write_through_reported

        write_through_reported(job=job, report=snapshot)
    _publish(snapshot, "snapshot.reported")
    return snapshot


def _audit_report(job: Job, snapshot: JobSnapshot, seconds: float | None) -> None:
    details = snapshot.details or {}
    audit_record(
        actor=None,
        action=f"job.{snapshot.kind}",
        target=job,
        tenant_id=job.tenant_id,
        changes={
            "iteration": snapshot.iteration,
            "seconds": seconds,
            "stalled_ranks": snapshot.stalled_ranks,
            "note": snapshot.note,
            **{k: details[k] for k in ("reason", "lost_ranks", "lost_nodes", "to_nodes") if k in details},
        },
    )


# How long after Lockstep's restore finished in the scheduler the runtime's own restore report still belongs to it.
RESTORE_REPORT_WINDOW = timedelta(minutes=30)


def restore_measured(*, job: Job, report: JobSnapshot) -> RecoveryAction | None:
    """The job's runtime says where it restored to after Lockstep's restore_from_snapshot or proactive move (a
    ``restore`` from memory, or a ``disk_fallback``): the ledger books what happened instead of what was planned
    (docs/gpu-hours.md). Work lost: the iterations from the job's last progress report before the relaunch back to
    the iteration restored, at the job's measured step time; pause: from the fault's detection (a proactive move:
    from its start, the job ran until then) until the runtime had restored (training resumes from there). A
    proactive move's saving stays expected until its prediction settles. The action then points at this report, so
    a report is booked once. Returns the action rebooked, or None when none of Lockstep's waits for its report."""
    action = _action_awaiting_report(job, report)
    if action is None:
        return None
    proactive = action.kind == ActionKind.PROACTIVE_MIGRATION
    # A proactive move's job trained on after the move started, up to its write-through: its reports until the
    # relaunch count.
    before = report.started_at if proactive else (action.started_at or action.detected_at)
    reached = JobProgress.objects.filter(job=job, at__lt=before).aggregate(reached=Max("iteration"))[
        "reached"
    ]
    if reached is None:
        reached = (action.restore_iteration or 0) + round(
            action.work_lost_seconds / max(job.seconds_per_iteration, 1e-6)
        )
    planned = action.restore_iteration
    action.snapshot, action.restore_iteration = report, report.iteration
    action.work_lost_seconds = max(0, reached - report.iteration) * job.seconds_per_iteration
    since = (action.started_at or action.detected_at) if proactive else action.detected_at
    action.pause_seconds = max(0.0, (report.ended_at - since).total_seconds())
    action.snapshot_overhead_seconds = _overhead_since_previous_recovery(job, action)
    action.gpu_hours_lost = actual_gpu_hours(
        gpus=action.gpus,
        pause_seconds=action.pause_seconds,
        work_lost_seconds=action.work_lost_seconds,
        degraded_seconds=action.degraded_seconds,
        slowdown=action.slowdown,
        overhead_seconds=action.snapshot_overhead_seconds,
    )
    saving = action.gpu_hours_baseline - action.gpu_hours_lost
    if not proactive or action.saving == SavingState.REALIZED:
        action.gpu_hours_saved = saving
    elif action.saving == SavingState.EXPECTED:
        action.gpu_hours_expected, _ = expected_saving(saving, score=action.risk_score)
    how = (
        "from memory" if report.kind == SnapshotKind.RESTORE else "from disk (its in-memory copies were lost)"
    )
    action.reason = (
        f"{action.reason} Measured: the runtime restored iteration {report.iteration} {how} "
        f"(planned {planned}); the job had reached {reached}; back "
        f"{action.pause_seconds:.1f} s after detection; its snapshots had cost "
        f"{action.snapshot_overhead_seconds:.1f} s of training since the previous recovery."
    )[:4000]
    _save_measured(action, job=job, report=report, planned=planned, reached=reached)
    publish_action(action, "action.measured")
    return action


def _action_awaiting_report(job: Job, report: JobSnapshot) -> RecoveryAction | None:
    """The job's latest restore or proactive move (locked) that finished within ``RESTORE_REPORT_WINDOW`` before
    the runtime's ``report`` and has not been booked from one of its restore reports yet, or None."""
    return (
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
        .filter(
            job=job,
            kind__in=(ActionKind.RESTORE_FROM_SNAPSHOT, ActionKind.PROACTIVE_MIGRATION),
            dry_run=False,
            state=ActionState.SUCCEEDED,
            ended_at__lte=report.ended_at,
            ended_at__gte=report.ended_at - RESTORE_REPORT_WINDOW,
        )
        .exclude(snapshot__kind__in=(SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK))
        .order_by("-ended_at")
        .first()
    )


def _save_measured(
    action: RecoveryAction, *, job: Job, report: JobSnapshot, planned: int | None, reached: int
) -> None:
    """Write the measured ledger ``restore_measured`` booked on ``action`` and audit it, against the
    ``planned`` restore iteration and the iteration the job had ``reached``."""
    action.save(
        update_fields=[
            "snapshot",
            "restore_iteration",
            "work_lost_seconds",
            "pause_seconds",
            "snapshot_overhead_seconds",
            "gpu_hours_lost",
            "gpu_hours_saved",
            "gpu_hours_expected",
            "reason",
        ]
    )
    audit_record(
        actor=None,
        action="recovery.measured",
        target=action,
        tenant_id=job.tenant_id,
        changes={
            "restore_iteration": [planned, report.iteration],
            "reached": reached,
            "work_lost_seconds": round(action.work_lost_seconds, 3),
            "pause_seconds": round(action.pause_seconds, 3),
            "snapshot_overhead_seconds": round(action.snapshot_overhead_seconds, 3),
            "gpu_hours_saved": round(action.gpu_hours_saved, 4),
            "gpu_hours_expected": round(action.gpu_hours_expected or 0.0, 4),
        },
    )


def _overhead_since_previous_recovery(job: Job, action: RecoveryAction) -> float:
    """What protection cost the job while it trained up to this fault: the runtime's measured snapshot overhead
    (each report carries its own since the one before) from the end of the job's previous recovery, or its start,
    until the fault was detected."""
    previous = (
        RecoveryAction.objects.filter(job=job, dry_run=False, ended_at__lt=action.detected_at)
        .exclude(pk=action.pk)
        .aggregate(at=Max("ended_at"))["at"]
    )
    reports = JobSnapshot.objects.filter(
        job=job, overhead_seconds__isnull=False, ended_at__lte=action.detected_at
    )
    if previous is not None:
        reports = reports.filter(ended_at__gt=previous)
    return float(reports.aggregate(total=Sum("overhead_seconds"))["total"] or 0.0)


def _hang_fault(job: Job, snapshot: JobSnapshot) -> None:
    """The runtime saw a rank stall: the same ``hang`` fault the silence sweep raises, on the stalled rank's node
    where the report names one Lockstep knows (else the job's first), so the fault path restarts the job."""
    from jobs.services.faults import fault_ingest

    allocations = list(
        JobAllocation.objects.filter(job=job, released_at__isnull=True)
        .select_related("node")
        .order_by("rank_start")
    )
    if not allocations:
        return
    named = {
        str(place.get("node"))
        for place in snapshot.locations
        if isinstance(place, dict) and place.get("node")
    }
    node = next((a.node for a in allocations if a.node.hostname in named), allocations[0].node)
    fault_ingest(
        source="agent",
        kind="hang",
        node=node,
        details={
            "job": job.pk,
            "iteration": snapshot.iteration,
            "stalled_ranks": snapshot.stalled_ranks,
            "silent_seconds": snapshot.seconds,
            "reported_by": "protection runtime",
            "note": snapshot.note[:300],
        },
    )


@dataclass(frozen=True)
class RuntimeRestorePoint:
    """The newest restore point a job's runtime reported, and what its restores have measured."""

    snapshot: JobSnapshot
    iteration: int
    age_seconds: float  # since it was complete
    restore_seconds: float | None  # median of the job's last measured in-memory restores (None: none yet)
    restores: int  # how many of those there were
    size_bytes: int | None


def runtime_restore_point(*, job: Job, at: datetime | None = None) -> RuntimeRestorePoint | None:
    """For the planner: the job's newest runtime restore point at ``at`` (now) newer than its last checkpoint,
    with the measured duration of its recent in-memory restores. None when its runtime reported none."""
    at = at or timezone.now()
    newest = (
        JobSnapshot.objects.filter(
            job=job,
            reason=SnapshotReason.RUNTIME,
            state=SnapshotState.SUCCEEDED,
            kind__in=RESTORE_POINT_KINDS,
            ended_at__lte=at,
            iteration__gt=job.last_checkpoint_iteration or 0,
        )
        .order_by("-iteration", "-ended_at")
        .first()
    )
    if newest is None:
        return None
    measured = [
        s.seconds
        for s in JobSnapshot.objects.filter(job=job, kind=SnapshotKind.RESTORE, ended_at__lte=at).order_by(
            "-ended_at"
        )[:20]
        if s.seconds is not None
    ]
    return RuntimeRestorePoint(
        snapshot=newest,
        iteration=newest.iteration,
        age_seconds=max(0.0, (at - newest.ended_at).total_seconds()),
        restore_seconds=statistics.median(measured) if measured else None,
        restores=len(measured),
        size_bytes=newest.size_bytes,
    )
