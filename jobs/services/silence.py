"""Silence is a fault: a node whose agent stops reporting, and a job that stops reporting progress (a hang).

Only what reported before is judged (``Node.last_seen_at`` set; a job that reported through the progress API). A
node silent for SILENCE_INTERVALS agent intervals gets a ``node_unreachable`` fault (source ``heartbeat``) that
joins its incident like any other report — unless at least half of its cluster's reporting nodes went silent
within two intervals of each other: that is the network between Lockstep and the cluster, not the nodes, so
nothing is raised or drained, and the cluster is marked unreachable (``Cluster.reachability``, Lockstep's view,
apart from the driver's connection settings) with a notification. A job silent for HANG_STEP_MULTIPLE × its
median step time (at least HANG_FLOOR_SECONDS) gets a ``hang`` fault, priced like a crash of its own code.
Each silence is raised once: a fault detected after the node or job was last heard from already says it.
"""

import statistics
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record
from fleet.choices import NodeState, Reachability
from fleet.models import Cluster, Node
from jobs.choices import FaultKind, FaultSource, JobState
from jobs.models import FaultEvent, Job, JobAllocation, JobProgress
from jobs.services.faults import fault_ingest

# Nodes whose silence says nothing new: out of service already (failed, and being repaired).
NOT_JUDGED = (NodeState.FAILED,)


def silence_sweep(*, now=None) -> dict:
    """Judge every cluster's silent nodes and every silent job; returns counts of what was raised or marked."""
    now = now or timezone.now()
    counts = {"node_unreachable": 0, "clusters_unreachable": 0, "clusters_reachable": 0, "hang": 0}
    for cluster in Cluster.objects.filter(
        Q(nodes__last_seen_at__isnull=False) | Q(reachability=Reachability.UNREACHABLE)
    ).distinct():
        for key, value in nodes_judge(cluster, now=now).items():
            counts[key] += value
    counts["hang"] = jobs_judge(now=now)
    return counts


def nodes_judge(cluster, *, now) -> dict:
    interval = float(settings.AGENT_INTERVAL_SECONDS)
    limit = now - timedelta(seconds=settings.SILENCE_INTERVALS * interval)
    reporting = list(
        Node.objects.filter(cluster=cluster, last_seen_at__isnull=False).values_list(
            "pk", "last_seen_at", "state"
        )
    )
    silent = [(pk, seen) for pk, seen, state in reporting if seen < limit and state not in NOT_JUDGED]
    counts = {"node_unreachable": 0, "clusters_unreachable": 0, "clusters_reachable": 0}
    if not silent:
        if cluster.reachability == Reachability.UNREACHABLE:
            counts["clusters_reachable"] = _reachability_set(
                cluster, Reachability.REACHABLE, now, f"{cluster.name} reports again"
            )
        return counts
    # The nodes that went silent together: within two intervals of the latest to go quiet.
    latest = max(seen for _, seen in silent)
    together = [pk for pk, seen in silent if seen >= latest - timedelta(seconds=2 * interval)]
    if len(together) * 2 >= len(reporting):
        if cluster.reachability != Reachability.UNREACHABLE:
            counts["clusters_unreachable"] = _reachability_set(
                cluster,
                Reachability.UNREACHABLE,
                now,
                f"{cluster.name} unreachable: {len(together)} of its {len(reporting)} reporting nodes went silent at "
                f"once; the network to it, not its nodes: nothing is drained",
            )
        return counts
    if cluster.reachability == Reachability.UNREACHABLE:
        counts["clusters_reachable"] = _reachability_set(
            cluster, Reachability.REACHABLE, now, f"{cluster.name} reports again"
        )
    nodes = Node.objects.in_bulk([pk for pk, _ in silent])
    raised = set(
        FaultEvent.objects.filter(
            node_id__in=list(nodes),
            kind=FaultKind.NODE_UNREACHABLE,
            detected_at__gte=min(seen for _, seen in silent),
        ).values_list("node_id", "detected_at")
    )
    already = {node_id for node_id, detected in raised if detected >= nodes[node_id].last_seen_at}
    for pk, seen in silent:
        if pk in already:
            continue
        quiet = (now - seen).total_seconds()
        fault_ingest(
            source=FaultSource.HEARTBEAT,
            kind=FaultKind.NODE_UNREACHABLE,
            node=nodes[pk],
            detected_at=min(now, seen + timedelta(seconds=settings.SILENCE_INTERVALS * interval)),
            details={
                "last_seen_at": seen.isoformat(),
                "silent_seconds": round(quiet, 1),
                "agent_interval_seconds": interval,
                "intervals": settings.SILENCE_INTERVALS,
            },
        )
        counts["node_unreachable"] += 1
    return counts


@transaction.atomic
def _reachability_set(cluster, reachability: str, now, summary: str) -> int:
    """Mark the cluster reachable or unreachable (once per change) and say so: an event the notifications follow."""
    changed = (
        Cluster.objects.filter(pk=cluster.pk)
        .exclude(reachability=reachability)
        .update(reachability=reachability, reachability_changed_at=now)
    )
    if not changed:
        return 0
    cluster.reachability, cluster.reachability_changed_at = reachability, now
    audit_record(
        actor=None,
        action=f"cluster.{reachability}",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={"reachability": reachability},
    )
    events.publish(
        [events.topic("cluster", cluster.pk), events.topic("fleet")],
        f"cluster.{reachability}",
        {
            "cluster": cluster.pk,
            "name": cluster.name,
            "reachability": reachability,
            "at": now.isoformat(),
            "summary": summary,
        },
        url=f"/api/v1/clusters/{cluster.pk}/",
    )
    return 1


def hang_threshold(step_seconds: list[float]) -> float:
    """Seconds of silence that make a hang: HANG_STEP_MULTIPLE × the median step time, at least HANG_FLOOR_SECONDS."""
    median = statistics.median(step_seconds) if step_seconds else 0.0
    return max(float(settings.HANG_FLOOR_SECONDS), float(settings.HANG_STEP_MULTIPLE) * median)


def jobs_judge(*, now) -> int:
    """Raise a hang for each running job that reported progress and has been silent past its threshold."""
    floor = now - timedelta(seconds=settings.HANG_FLOOR_SECONDS)
    candidates = list(
        Job.objects.filter(
            state=JobState.RUNNING,
            reports_progress=True,
            iteration_at__lt=floor,
            progress__step_seconds__isnull=False,
        ).distinct()
    )
    raised = 0
    for job in candidates:
        steps = list(
            JobProgress.objects.filter(job=job, step_seconds__isnull=False)
            .order_by("-at")
            .values_list("step_seconds", flat=True)[:50]
        )
        threshold = hang_threshold(steps)
        quiet = (now - job.iteration_at).total_seconds()
        if quiet < threshold:
            continue
        if FaultEvent.objects.filter(
            kind=FaultKind.HANG, details__job=job.pk, detected_at__gte=job.iteration_at
        ).exists():
            continue
        allocation = (
            JobAllocation.objects.filter(job=job, released_at__isnull=True)
            .select_related("node")
            .order_by("pk")
            .first()
        )
        if allocation is None:
            continue
        fault_ingest(
            source=FaultSource.HEARTBEAT,
            kind=FaultKind.HANG,
            node=allocation.node,
            detected_at=min(now, job.iteration_at + timedelta(seconds=threshold)),
            details={
                "job": job.pk,
                "iteration": job.iteration,
                "silent_seconds": round(quiet, 1),
                "threshold_seconds": round(threshold, 1),
                "median_step_seconds": round(statistics.median(steps), 3) if steps else None,
            },
        )
        raised += 1
    return raised
