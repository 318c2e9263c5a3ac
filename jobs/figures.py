"""Data → figures: the job timeline (phases, faults, actions, snapshots, iterations against the
restart-from-checkpoint counterfactual) and GPU-hours saved over time. Plain data, rendered by static/js."""

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncDay, TruncHour, TruncMinute
from django.utils import timezone

from controlplane.snapshot import one_moment
from jobs.choices import ActionState, JobState, SavingState
from jobs.models import FaultEvent, Job, JobPhase, JobProgress, JobSnapshot, RecoveryAction
from jobs.services.publishing import action_payload, fault_payload


def _iso(value):
    return value.isoformat() if value else None


def counterfactual(points: list[tuple], savings: list[tuple], seconds_per_iteration: float) -> list[tuple]:
    """Iterations the job would have reached had every recovery been a restart from checkpoint: at each
    point, the actual iteration less the seconds each earlier recovery saved (docs/gpu-hours.md), in iterations.
    ``points`` are (time, iteration); ``savings`` are (time, seconds saved per GPU)."""
    out = []
    for at, iteration in points:
        lost = sum(seconds for when, seconds in savings if when <= at)
        out.append((at, max(0, iteration - int(lost / max(seconds_per_iteration, 1e-6)))))
    return out


@one_moment()
def job_timeline(job: Job, *, since=None) -> dict:
    """Everything the job page draws, from the database (so a reload loses nothing), as of one moment. With
    ``since`` the phases, faults, actions, snapshots and iterations are those of the window from then to now (the
    last progress point before it too, so the line starts at the window's edge); the GPU-hours saved and the
    counterfactual still count every recovery, and so do the GPU-hours lost (those same recoveries' cost)."""
    now = timezone.now()
    phase_rows = JobPhase.objects.filter(job=job).order_by("started_at", "id")
    snapshot_rows = JobSnapshot.objects.filter(job=job).order_by("started_at")
    progress = JobProgress.objects.filter(job=job).order_by("at", "id").values_list("at", "iteration")
    if since is not None:
        phase_rows = phase_rows.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        snapshot_rows = snapshot_rows.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        before = (
            JobProgress.objects.filter(job=job, at__lt=since)
            .order_by("-at", "-id")
            .values_list("at", "iteration")[:1]
        )
        points = [*before, *progress.filter(at__gte=since)]
    else:
        points = list(progress)
    phases = [
        {"kind": p.kind, "start": _iso(p.started_at), "end": _iso(p.ended_at), "reason": p.reason}
        for p in phase_rows
    ]
    actions = list(
        RecoveryAction.objects.filter(job=job).select_related("job", "cluster").order_by("planned_at", "id")
    )
    shown = [
        a for a in actions if since is None or (a.ended_at or a.started_at or a.planned_at or now) >= since
    ]
    fault_ids = {a.fault_id for a in shown if a.fault_id}
    faults = [
        fault_payload(f)
        for f in FaultEvent.objects.filter(pk__in=fault_ids).select_related("node").order_by("detected_at")
    ]
    snapshots = [
        {
            "snapshot": s.pk,
            "state": s.state,
            "iteration": s.iteration,
            "reason": s.reason,
            "start": _iso(s.started_at),
            "end": _iso(s.ended_at),
            "seconds": s.seconds,
        }
        for s in snapshot_rows
    ]
    if job.state == JobState.RUNNING:
        points.append((now, job.iteration_now(now)))
    savings = [
        (a.ended_at, a.gpu_hours_saved * 3600 / max(a.gpus, 1))
        for a in actions
        if a.state == ActionState.SUCCEEDED and a.ended_at and not a.dry_run
    ]
    counter = counterfactual(points, savings, job.seconds_per_iteration)
    booked = [a for a in actions if a.state == ActionState.SUCCEEDED and not a.dry_run]
    saved = sum(a.gpu_hours_saved for a in booked)
    lost = sum(a.gpu_hours_lost for a in booked)
    actions = shown
    return {
        "job": job.pk,
        "state": job.state,
        "now": _iso(now),
        "since": _iso(since),
        "seconds_per_iteration": job.seconds_per_iteration,
        "phases": phases,
        "faults": faults,
        "actions": [action_payload(a) for a in actions],
        "snapshots": snapshots,
        "iterations": {
            "t": [_iso(at) for at, _ in points],
            "actual": [it for _, it in points],
            "counterfactual": [it for _, it in counter],
        },
        "gpu_hours_saved": round(saved, 4),
        "gpu_hours_lost": round(lost, 4),
    }


GROUPS = {
    "job": ("job_id", "job__name"),
    "cluster": ("cluster_id", "cluster__name"),
    "tenant": ("job__tenant_id", "job__tenant__name"),
    "fleet": ("cluster__fleet_id", "cluster__fleet__name"),
}
BUCKETS = {"minute": TruncMinute, "hour": TruncHour, "day": TruncDay}


@one_moment()
def gpu_hours_stats(*, actions, faults, group: str, bucket: str, since=None) -> dict:
    """Totals of the ledger per group, and GPU-hours saved per time bucket (with a running total), all read as
    of one moment (the series' last running total is the total). ``actions`` and ``faults`` are querysets already
    scoped to the reader."""
    done = actions.filter(state=ActionState.SUCCEEDED, dry_run=False, job__isnull=False)
    if since is not None:
        done = done.filter(ended_at__gte=since)
        faults = faults.filter(detected_at__gte=since)
    key, name = GROUPS[group]
    expected = Sum("gpu_hours_expected", filter=Q(saving=SavingState.EXPECTED))
    rows = (
        done.values(key, name)
        .annotate(
            actions=Count("id"),
            saved=Sum("gpu_hours_saved"),
            lost=Sum("gpu_hours_lost"),
            baseline=Sum("gpu_hours_baseline"),
            expected=expected,
        )
        .order_by("-saved")
    )
    groups = [
        {
            "id": row[key],
            "name": row[name],
            "actions": row["actions"],
            "gpu_hours_saved": round(row["saved"] or 0, 4),
            "gpu_hours_lost": round(row["lost"] or 0, 4),
            "gpu_hours_baseline": round(row["baseline"] or 0, 4),
            "gpu_hours_expected": round(row["expected"] or 0, 4),
        }
        for row in rows[:500]
    ]
    series_rows = (
        done.annotate(bucket=BUCKETS[bucket]("ended_at"))
        .values("bucket")
        .annotate(saved=Sum("gpu_hours_saved"), actions=Count("id"))
        .order_by("bucket")
    )
    total, series = 0.0, []
    for row in series_rows:
        total += row["saved"] or 0
        series.append(
            {
                "t": _iso(row["bucket"]),
                "gpu_hours_saved": round(row["saved"] or 0, 4),
                "cumulative": round(total, 4),
                "actions": row["actions"],
            }
        )
    totals = done.aggregate(
        saved=Sum("gpu_hours_saved"),
        lost=Sum("gpu_hours_lost"),
        baseline=Sum("gpu_hours_baseline"),
        expected=expected,
        actions=Count("id"),
    )
    return {
        "group": group,
        "bucket": bucket,
        "since": _iso(since),
        "totals": {
            "faults": faults.count(),
            "actions": totals["actions"],
            "gpu_hours_saved": round(totals["saved"] or 0, 4),
            "gpu_hours_lost": round(totals["lost"] or 0, 4),
            "gpu_hours_baseline": round(totals["baseline"] or 0, 4),
            "gpu_hours_expected": round(totals["expected"] or 0, 4),
        },
        "groups": groups,
        "series": series,
    }


def incident_ledger(actions) -> dict:
    """An incident's ledger entry, from its actions (docs/gpu-hours.md, "Per incident"): baseline, lost and
    realized saved GPU-hours of its succeeded recoveries as every total counts them (dry runs left out), the
    expected saving of those whose prediction is not settled, and how many jobs it hit."""
    actions = list(actions)
    booked = [
        a for a in actions if a.state == ActionState.SUCCEEDED and not a.dry_run and a.job_id is not None
    ]
    return {
        "gpu_hours_baseline": round(sum(a.gpu_hours_baseline for a in booked), 4),
        "gpu_hours_lost": round(sum(a.gpu_hours_lost for a in booked), 4),
        "gpu_hours_saved": round(
            sum(a.gpu_hours_saved for a in booked if a.saving == SavingState.REALIZED), 4
        ),
        "gpu_hours_expected": round(
            sum(a.gpu_hours_expected for a in booked if a.saving == SavingState.EXPECTED), 4
        ),
        "jobs": len({a.job_id for a in actions if a.job_id is not None}),
    }


def faults_for_feed(faults, limit: int = 50) -> list[dict]:
    return [fault_payload(f) for f in faults.order_by("-received_at")[:limit]]


def timeline_summary(timeline: dict) -> dict[str, str]:
    """The job page's charts in words (their text alternatives): the phases, faults and recoveries of the
    timeline, and where the iterations went against the restart-from-checkpoint counterfactual."""
    counts: dict[str, int] = {}
    for phase in timeline["phases"]:
        counts[phase["kind"]] = counts.get(phase["kind"], 0) + 1
    phases = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "none"
    actions = [f"{a['kind']} {a['state']}" for a in timeline["actions"]]
    listed = "; ".join(actions[-5:]) + (f" and {len(actions) - 5} earlier" if len(actions) > 5 else "")
    events = (
        f"Phases: {phases}. {len(timeline['faults'])} fault{'s' * (len(timeline['faults']) != 1)}, "
        f"{len(actions)} recovery action{'s' * (len(actions) != 1)}{': ' + listed if actions else ''}; "
        f"{len(timeline['snapshots'])} snapshot{'s' * (len(timeline['snapshots']) != 1)}."
    )
    iterations = timeline["iterations"]
    if iterations["actual"]:
        progress = (
            f"From iteration {iterations['actual'][0]:,} to {iterations['actual'][-1]:,}; restarting from the "
            f"last checkpoint after each fault would have reached {iterations['counterfactual'][-1]:,}."
        )
    else:
        progress = "No progress reported in this range."
    return {"timeline": events, "iterations": progress}
