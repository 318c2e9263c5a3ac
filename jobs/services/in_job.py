"""In-job recovery (issue 49): what a protected job's runtime reports of its own allocation.

- ``standbys`` (in its restore-point reports and ``rank_replaced``): the nodes of the job's allocation whose ranks
  wait, warm, to take a lost rank's place. They are booked to the job (``JobStandby``), shown on its page, and are
  never free spares of the cluster (jobs.placement leaves them out).
- ``peer_lost``: a survivor's collective with a rank failed. The lost node gets a ``node_unreachable`` fault from
  source ``runtime``, which opens the node's incident or joins the one the agent, Slurm or another survivor opened
  (one incident however many report it).
- ``rank_replaced``: a standby took the lost rank and the job completed its first step after it; Lockstep's
  rank_replacement for the job is booked from it (jobs.services.rank_replacement).
"""

from datetime import UTC, datetime

from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.models import Node
from jobs.choices import FaultKind, FaultSource, SnapshotKind
from jobs.models import Job, JobAllocation, JobSnapshot, JobStandby


def epoch(value) -> datetime | None:
    """A report's epoch seconds as a time (None when absent)."""
    if value is None:
        return None
    return datetime.fromtimestamp(float(value), tz=UTC)


def in_job_reported(*, job: Job, report: JobSnapshot) -> None:
    """Act on what a runtime report carries beside its restore point (called inside ``snapshot_report``'s
    transaction: a refusal leaves nothing written)."""
    details = report.details or {}
    if report.kind == SnapshotKind.PEER_LOST:
        _peer_lost(job, report)
    if report.kind == SnapshotKind.RANK_REPLACED:
        from jobs.services.rank_replacement import rank_replaced

        rank_replaced(job=job, report=report)
    named = details.get("standbys", details.get("standbys_left"))
    if named is not None:
        standbys_record(job=job, hostnames=list(named))


def standbys_record(*, job: Job, hostnames: list[str]) -> list[JobStandby]:
    """The job's live standbys are the nodes its runtime names now: new ones are booked to it, those no longer
    named (a standby that took a rank, or was lost) are released. Names Lockstep does not know on the job's
    cluster, nodes the job may not stand by on (``_may_stand_by``) and nodes another job holds as its standby are
    left out; the job's allocations on its standbys (a
    launcher registers the whole Slurm allocation) are released, as no rank runs there. Returns the live
    standbys."""
    now = timezone.now()
    nodes = {
        node.pk: node
        for node in Node.objects.filter(
            cluster_id=job.cluster_id, hostname__in=set(hostnames), pk__in=_may_stand_by(job)
        ).order_by("pk")
    }
    live = {s.node_id: s for s in JobStandby.objects.filter(job=job, released_at__isnull=True)}
    gone = [pk for node_id, standby in live.items() if node_id not in nodes for pk in [standby.pk]]
    if gone:
        JobStandby.objects.filter(pk__in=gone).update(
            released_at=now, released_why="no longer reported as a standby"
        )
    # A job registered on its whole Slurm allocation holds its standbys' nodes as ranks: they hold none.
    JobAllocation.objects.filter(job=job, node_id__in=list(nodes), released_at__isnull=True).update(
        released_at=now
    )
    new = [JobStandby(job=job, node=nodes[pk], since=now) for pk in nodes if pk not in live]
    if new:
        # A node another job still holds as its standby stays that job's (its next report releases it).
        JobStandby.objects.bulk_create(new, ignore_conflicts=True)
    return list(JobStandby.objects.filter(job=job, released_at__isnull=True).select_related("node"))


def _may_stand_by(job: Job) -> set[int]:
    """The nodes a job's runtime may book as its standbys: those of its own allocation (it registers the whole of
    it, standbys too) and those the standby jobs Lockstep started for it run on (``standby_replenish`` records
    them as the Slurm sync sees them). A name beyond them is left out: a job may not hold a free spare of the
    cluster, or another job's node, by naming it."""
    from jobs.choices import ActionKind
    from jobs.models import RecoveryAction

    allocated = set(JobAllocation.objects.filter(job=job).values_list("node_id", flat=True))
    started = RecoveryAction.objects.filter(
        job=job, kind=ActionKind.RANK_REPLACEMENT, estimate__standby__nodes__isnull=False
    ).values_list("estimate__standby__nodes", flat=True)
    hosts = {str(h) for nodes in started for h in nodes or []}
    if hosts:
        allocated |= set(
            Node.objects.filter(cluster_id=job.cluster_id, hostname__in=hosts).values_list("pk", flat=True)
        )
    return allocated


def live_standbys(job: Job) -> list[JobStandby]:
    """The job's standbys now: booked to it, on nodes that are not lost."""
    return [
        s
        for s in JobStandby.objects.filter(job=job, released_at__isnull=True).select_related("node")
        if s.node.state not in ("failed",)
    ]


def _lost_nodes(job: Job, details: dict) -> list[Node]:
    """The nodes a ``peer_lost`` names: by hostname among the nodes the job holds (its ranks' allocations and its
    live standbys: a job's report may never open a fault on a node it does not hold, another tenant's on a shared
    cluster), else by the lost ranks' allocations."""
    hosts = [str(h) for h in details.get("lost_nodes") or []]
    held_ids = set(
        JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list("node_id", flat=True)
    ) | set(JobStandby.objects.filter(job=job, released_at__isnull=True).values_list("node_id", flat=True))
    found = {
        node.pk: node
        for node in Node.objects.filter(
            cluster_id=job.cluster_id, hostname__in=hosts, pk__in=held_ids
        ).order_by("pk")
    }
    named = {node.hostname for node in found.values()}
    if len(named) < len(set(hosts)) or not hosts:
        ranks = {int(r) for r in details.get("lost_ranks") or []}
        held = JobAllocation.objects.filter(job=job, released_at__isnull=True).select_related("node")
        for rank, allocation in enumerate(held.order_by("rank_start")):
            if rank in ranks:
                found.setdefault(allocation.node_id, allocation.node)
    return list(found.values())


def _peer_lost(job: Job, report: JobSnapshot) -> None:
    from jobs.services.faults import fault_ingest

    details = report.details
    nodes = _lost_nodes(job, details)
    if not nodes:
        raise ServiceError(
            "none of the lost nodes or ranks is a node the job holds",
            field="lost_nodes",
        )
    for node in nodes:
        fault_ingest(
            source=FaultSource.RUNTIME,
            kind=FaultKind.NODE_UNREACHABLE,
            node=node,
            detected_at=epoch(details.get("at")),
            details={
                "reported_by": "protection runtime",
                "reporting_job": job.pk,
                "lost_ranks": details.get("lost_ranks") or [],
                "generation": details.get("generation"),
                "iteration": report.iteration,
                "detail": str(details.get("detail") or "")[:500],
            },
        )
