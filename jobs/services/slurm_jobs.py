"""Lockstep follows its Slurm clusters: nodes and jobs as Slurm reports them (beat: ``jobs.slurm_sync``).

Nodes: a node Slurm lists that Lockstep does not know is added (its GPUs from gres, a spare when it is idle in
the connection's ``spare_partition``, cordoned or failed when Slurm holds it out). A node Slurm marks ``down`` or
``not_responding`` that Lockstep still counts in service becomes a fault (source ``slurm``, node_unreachable),
which joins the node's incident with the agent's and Alertmanager's reports; what Lockstep does about it (drain
with its reason, requeue the job without the node) is the fault path's. Lockstep's own node states (cordoned,
draining, failed, spare) are never overwritten from Slurm once the node is known: the escalation ladder owns them.

Jobs: a running Slurm job Lockstep does not follow yet is adopted (``jobs.launchers.slurm_job_adopt``: tenant by
account mapping). A job of an account that maps to no tenant is kept as a ``SlurmJob`` without a Lockstep job,
listed to the provider only (``/api/v1/slurm-jobs/?unmapped=true``), and adopted by a later sync once its account
maps. A followed job moves with what Slurm reports, unless a recovery of it is under way or one of its nodes has an
open incident (then the fault path decides, and requeues it):

- ended: completed → Completed, cancelled → Cancelled, failed (failed, node_fail, timeout, out_of_memory, …) →
  Failed;
- requeued by Slurm itself (its restart count rose by more than Lockstep's own restarts of it since the last look:
  an admin's ``scontrol requeue``, a ``--requeue`` job on a node Slurm set down): Recovering, its nodes released,
  with a recovering phase that says so; no recovery action and no ledger entry, as Lockstep did nothing;
- running again, or running on other nodes than Lockstep holds for it (Slurm placed a restart elsewhere than the
  spare Lockstep booked): Running, its allocations realigned to the hosts Slurm runs it on.

A Slurm node Lockstep counts ready or spare, with no job of Lockstep's on it, follows the spare partition: idle
there, a spare; anywhere else, ready.
"""

import logging
import math
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet.choices import DriverName, NodeState
from fleet.drivers import DriverError
from fleet.drivers.slurm import SlurmDriver, gpus_of, node_condition
from fleet.models import GPU, Cluster, Node
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    ACTIVE_JOB_STATES,
    ActionKind,
    FaultKind,
    FaultSource,
    IncidentState,
    JobPhaseKind,
    JobState,
    SnapshotKind,
)
from jobs.launchers import hostnames_of, slurm_job_adopt, slurm_job_unmapped
from jobs.models import Incident, Job, JobAllocation, JobSnapshot, JobStandby, RecoveryAction, SlurmJob
from jobs.placement import allocations_move
from jobs.services.faults import fault_ingest
from jobs.services.jobs import _stop, job_fail
from jobs.services.phases import phase_start, record_progress
from jobs.services.publishing import publish_job

log = logging.getLogger(__name__)

ENDED = {"COMPLETED": JobState.COMPLETED, "CANCELLED": JobState.CANCELLED}
FAILED = {"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
DEAD = ("down", "not_responding")


def _node_state(slurm_node: dict, spare_partition: str) -> str:
    condition = node_condition(slurm_node)
    if condition in DEAD:
        return NodeState.FAILED
    if condition in ("drained", "draining"):
        return NodeState.CORDONED
    if spare_partition and spare_partition in (slurm_node.get("partitions") or []) and condition == "idle":
        return NodeState.SPARE
    return NodeState.READY


def sync_nodes(cluster: Cluster, slurm_nodes: list[dict]) -> dict:
    connection = cluster.connection or {}
    spare_partition = connection.get("spare_partition") or ""
    gpu_model = str(connection.get("gpu_model") or "gpu")[:30]
    known = {node.hostname: node for node in Node.objects.filter(cluster=cluster)}
    held = set(
        JobAllocation.objects.filter(node__cluster=cluster, released_at__isnull=True).values_list(
            "node_id", flat=True
        )
    ) | set(
        JobStandby.objects.filter(node__cluster=cluster, released_at__isnull=True).values_list(
            "node_id", flat=True
        )
    )
    added, faults = [], []
    now = timezone.now()
    for slurm_node in slurm_nodes:
        name = slurm_node.get("name")
        if not name:
            continue
        node = known.get(name)
        condition = node_condition(slurm_node)
        if node is None:
            node = Node.objects.create(
                cluster=cluster,
                hostname=name[:100],
                gpu_model=gpu_model,
                state=_node_state(slurm_node, spare_partition),
                state_reason=(slurm_node.get("reason") or "")[:300],
                last_seen_at=None if condition in DEAD else now,
            )
            GPU.objects.bulk_create(
                [
                    GPU(node=node, index=i, uuid=f"slurm-{cluster.pk}-{name}-gpu{i}"[:64], model=gpu_model)
                    for i in range(gpus_of(slurm_node.get("gres") or ""))
                ]
            )
            added.append(name)
            continue
        if condition == "idle" and node.state in (NodeState.READY, NodeState.SPARE) and node.pk not in held:
            follows = _node_state(slurm_node, spare_partition)
            if follows != node.state:
                Node.objects.filter(pk=node.pk).update(
                    state=follows,
                    state_reason=f"Slurm: idle in {'the spare partition' if follows == NodeState.SPARE else 'a job partition'}",
                )
                node.state = follows
        if condition in DEAD and node.state in (NodeState.READY, NodeState.SPARE):
            fault, created = fault_ingest(
                source=FaultSource.SLURM,
                kind=FaultKind.NODE_UNREACHABLE,
                node=node,
                details={
                    "slurm_state": slurm_node.get("state"),
                    "slurm_flags": slurm_node.get("state_flags") or [],
                    "slurm_reason": slurm_node.get("reason") or "",
                },
            )
            faults.append(fault.pk)
    return {"added": added, "faults": faults}


def _recovery_under_way(job: Job) -> bool:
    if RecoveryAction.objects.filter(job=job, state__in=ACTIVE_ACTION_STATES, dry_run=False).exists():
        return True
    nodes = job.allocations.filter(released_at__isnull=True).values("node_id")
    return Incident.objects.filter(node_id__in=nodes, state=IncidentState.OPEN).exists()


def _epoch(value) -> datetime | None:
    try:
        seconds = int(value or 0)
    except (TypeError, ValueError):
        return None
    return datetime.fromtimestamp(seconds, tz=UTC) if seconds > 0 else None


def _end(link: SlurmJob, slurm_state: str) -> str | None:
    """Move the Lockstep job of a Slurm job that ended; returns its new state, or None when left alone."""
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=link.job_id)
        if job.state not in ACTIVE_JOB_STATES or _recovery_under_way(job):
            return None
        if slurm_state in ENDED:
            _stop(job, ENDED[slurm_state], reason=f"Slurm reports the job {slurm_state.lower()}")
            publish_job(job, "job.state")
        else:
            job_fail(job=job, reason=f"Slurm reports the job {slurm_state.lower()}")
        return job.state


def _own_restarts(job: Job, since) -> int:
    """Lockstep's own requeues of the job (restarts, restores and moves it started) since ``since``."""
    rows = RecoveryAction.objects.filter(
        job=job,
        kind__in=(
            ActionKind.RESTART_FROM_CHECKPOINT,
            ActionKind.RESTORE_FROM_SNAPSHOT,
            ActionKind.PROACTIVE_MIGRATION,
        ),
        dry_run=False,
        started_at__isnull=False,
    )
    return rows.filter(started_at__gte=since).count() if since else rows.count()


def _requeued(job: Job, *, restarts: int, at) -> None:
    """Slurm requeued the job on its own: it waits in Slurm's queue, holding no node."""
    job.iteration, job.iteration_at, job.state = job.iteration_now(at), at, JobState.RECOVERING
    job.save(update_fields=["iteration", "iteration_at", "state"])
    JobAllocation.objects.filter(job=job, released_at__isnull=True).update(released_at=at)
    phase_start(
        job, JobPhaseKind.RECOVERING, reason=f"Slurm requeued the job itself (restart {restarts})", at=at
    )
    audit_record(
        actor=None,
        action="job.requeued_by_slurm",
        target=job,
        tenant_id=job.tenant_id,
        changes={"state": [JobState.RUNNING, JobState.RECOVERING], "restart_count": restarts},
    )
    publish_job(job, "job.state", reason="requeued by Slurm")


def _realign(job: Job, hostnames: list[str]) -> list[str]:
    """Lockstep's allocations of the job follow the hosts Slurm runs it on; returns the hosts newly taken. Each
    allocation on a host Slurm no longer uses moves (ranks kept) to a host it now uses; a different number of
    hosts re-spreads the job's GPUs over Slurm's hosts."""
    hosts = list(dict.fromkeys(hostnames))
    nodes = {
        node.hostname: node for node in Node.objects.filter(cluster_id=job.cluster_id, hostname__in=hosts)
    }
    hosts = [host for host in hosts if host in nodes]
    allocations = list(JobAllocation.objects.filter(job=job, released_at__isnull=True).select_related("node"))
    held = {allocation.node.hostname for allocation in allocations}
    if not hosts or set(hosts) == held:
        return []
    gone = [allocation for allocation in allocations if allocation.node.hostname not in hosts]
    new = [host for host in hosts if host not in held]
    if len(gone) == len(new):
        allocations_move([(allocation, nodes[host]) for allocation, host in zip(gone, new, strict=True)])
        return new
    now = timezone.now()
    JobAllocation.objects.filter(pk__in=[a.pk for a in allocations]).update(released_at=now)
    per_node, rank, left = math.ceil(job.gpus / len(hosts)), 0, job.gpus
    rows = []
    for host in hosts:
        count = max(0, min(per_node, left))
        if count == 0:
            break
        rows.append(
            JobAllocation(
                job=job,
                node=nodes[host],
                gpu_indices=list(range(count)),
                rank_start=rank,
                rank_end=rank + count - 1,
            )
        )
        rank, left = rank + count, left - count
    JobAllocation.objects.bulk_create(rows)
    return new


def _running(job: Job, hostnames: list[str], *, at) -> None:
    """Slurm runs the job (again): Running, on the hosts Slurm gave it."""
    job.iteration_at, job.state = at, JobState.RUNNING
    job.save(update_fields=["iteration_at", "state"])
    _realign(job, hostnames)
    phase_start(
        job, JobPhaseKind.RUNNING, reason=f"Slurm runs it on {', '.join(hostnames) or 'its nodes'}", at=at
    )
    record_progress(job, at=at, iteration=job.iteration)
    publish_job(job, "job.state", reason="running again")


def _rankless(link: SlurmJob, slurm_job: dict) -> set[str]:
    """Hosts of the job's Slurm allocation that hold none of its ranks: its standbys, and the nodes it lost since
    Slurm last started it whose ranks a standby took (rank replacements: no requeue, so Slurm may still list
    them)."""
    standbys = JobStandby.objects.filter(job_id=link.job_id, released_at__isnull=True)
    lost = RecoveryAction.objects.filter(
        job_id=link.job_id, kind=ActionKind.RANK_REPLACEMENT, state="succeeded", node__isnull=False
    )
    # The runtime's own word, which may come before Lockstep decided anything (then no action names the node).
    replaced = JobSnapshot.objects.filter(job_id=link.job_id, kind=SnapshotKind.RANK_REPLACED)
    started = _epoch(slurm_job.get("start_time"))
    if started is not None:
        lost = lost.filter(ended_at__gte=started)
        replaced = replaced.filter(started_at__gte=started)
    from_nodes = {
        str(h)
        for details in replaced.values_list("details", flat=True)
        for h in details.get("from_nodes") or []
    }
    return (
        set(standbys.values_list("node__hostname", flat=True))
        | set(lost.values_list("node__hostname", flat=True))
        | from_nodes
    )


def lockstep_standbys(cluster: Cluster) -> dict[str, int]:
    """The standby jobs Lockstep started on the cluster (``SlurmDriver.replenish_standby``, recorded by
    ``standby_replenish``) for jobs still running: Slurm job id -> the rank replacement that asked for it. Only
    these are left out of adoption; a job of anyone else's that borrows the standby comment is followed as any
    other."""
    rows = RecoveryAction.objects.filter(
        cluster=cluster,
        kind=ActionKind.RANK_REPLACEMENT,
        estimate__standby__slurm_job_id__isnull=False,
        job__state__in=[JobState.RUNNING, JobState.RECOVERING],
    ).values_list("pk", "estimate__standby__slurm_job_id")
    return {str(slurm_id): pk for pk, slurm_id in rows}


def _standby_seen(action_id: int, slurm_job: dict) -> None:
    """Where a standby job Lockstep started runs, kept on the replacement that asked for it: the only nodes
    besides its own allocation that a job's runtime may name as its standbys (jobs.services.in_job)."""
    hosts = hostnames_of(slurm_job) if slurm_job.get("job_state") == "RUNNING" else []
    action = RecoveryAction.objects.filter(pk=action_id).only("estimate").first()
    standby = dict((action.estimate or {}).get("standby") or {}) if action else {}
    if action is None or standby.get("nodes") == hosts:
        return
    action.estimate = {**action.estimate, "standby": {**standby, "nodes": hosts}}
    action.save(update_fields=["estimate"])


def slurm_job_follow(*, link: SlurmJob, slurm_job: dict, previous_restarts: int, previous_seen=None) -> str:
    """The Lockstep job of a followed Slurm job moves with what Slurm reports of it (requeued by Slurm itself,
    running again, running elsewhere). Returns what was done ("" for nothing). Left to the fault path while a
    recovery of the job is under way or one of its nodes has an open incident."""
    state = slurm_job.get("job_state", "")
    restarts = int(slurm_job.get("restart_cnt") or 0)
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",), no_key=True).get(pk=link.job_id)
        if job.state not in (JobState.RUNNING, JobState.RECOVERING) or _recovery_under_way(job):
            return ""
        # Read under the job's lock: a runtime report that moves a rank to its standby holds it, and hosts read
        # before it committed would move the rank back to the lost node.
        hostnames = [host for host in hostnames_of(slurm_job) if host not in _rankless(link, slurm_job)]
        done = []
        slurms_own = restarts - previous_restarts - _own_restarts(job, previous_seen)
        if slurms_own > 0 and job.state == JobState.RUNNING:
            _requeued(job, restarts=restarts, at=previous_seen or timezone.now())
            done.append("requeued")
        if state == "RUNNING" and hostnames:
            if job.state == JobState.RECOVERING:
                started = _epoch(slurm_job.get("start_time")) or timezone.now()
                _running(job, hostnames, at=max(started, job.iteration_at))
                done.append("running")
            elif _realign(job, hostnames):
                publish_job(job, "job.allocations")
                done.append("realigned")
        return "+".join(done)


def sync_jobs(cluster: Cluster, slurm_jobs: list[dict], dead: frozenset[str] = frozenset()) -> dict:
    """``dead``: hosts Slurm reports down or not responding; a job that ended on one is the fault path's."""
    by_id = {str(j.get("job_id")): j for j in slurm_jobs}
    links = {
        link.slurm_job_id: link for link in SlurmJob.objects.filter(cluster=cluster).select_related("job")
    }
    adopted, unmapped, ended, followed = [], [], {}, {}
    standbys = lockstep_standbys(cluster)
    now = timezone.now()
    for slurm_id, slurm_job in by_id.items():
        state = slurm_job.get("job_state", "")
        link = links.get(slurm_id)
        if link is None and slurm_id in standbys:
            _standby_seen(standbys[slurm_id], slurm_job)
            continue  # a standby Lockstep started for a job it follows: the job's, not a job of its own
        if link is None or link.job_id is None:
            if state != "RUNNING":
                if link is not None:  # listed unmapped, and no longer running
                    link.delete()
                continue
            try:
                link = slurm_job_adopt(cluster=cluster, slurm_job=slurm_job)
                adopted.append(slurm_id)
            except ServiceError as error:
                slurm_job_unmapped(cluster=cluster, slurm_job=slurm_job, why=str(error.detail))
                unmapped.append(
                    {"slurm_job_id": slurm_id, "account": slurm_job.get("account", ""), "why": error.detail}
                )
            continue
        previous_restarts, previous_seen = link.restart_count, link.seen_at
        link.slurm_state, link.seen_at = state[:30], now
        link.restart_count = max(link.restart_count, int(slurm_job.get("restart_cnt") or 0))
        if state == "RUNNING":
            link.nodes = (slurm_job.get("nodes") or "")[:300]
        link.save(update_fields=["slurm_state", "seen_at", "restart_count", "nodes"])
        if (state in ENDED or state in FAILED) and not dead.intersection(hostnames_of(slurm_job)):
            moved = _end(link, state)
            if moved:
                ended[slurm_id] = moved
            continue
        if link.job.state in (JobState.RUNNING, JobState.RECOVERING):
            what = slurm_job_follow(
                link=link,
                slurm_job=slurm_job,
                previous_restarts=previous_restarts,
                previous_seen=previous_seen,
            )
            if what:
                followed[slurm_id] = what
    for slurm_id, link in links.items():
        if slurm_id in by_id:
            continue
        if link.job_id is None:
            link.delete()  # Slurm forgot it
        elif link.job.state in ACTIVE_JOB_STATES and link.slurm_state != "GONE":
            link.slurm_state = "GONE"
            link.save(update_fields=["slurm_state"])
            moved = _end(link, "FAILED")
            if moved:
                ended[slurm_id] = moved
    return {"adopted": adopted, "unmapped": unmapped, "ended": ended, "followed": followed}


def slurm_sync(*, cluster: Cluster) -> dict:
    """One look at a Slurm cluster: nodes first (their faults are stored before any job is judged), then jobs."""
    driver = SlurmDriver(cluster)
    try:
        slurm_nodes = driver.nodes()
        slurm_jobs = driver.jobs()
    except DriverError as error:
        log.warning("Slurm cluster %s did not answer: %s", cluster.name, error)
        return {"cluster": cluster.pk, "error": str(error)}
    result = {"cluster": cluster.pk, **sync_nodes(cluster, slurm_nodes)}
    dead = frozenset(n.get("name") for n in slurm_nodes if node_condition(n) in DEAD)
    result.update(sync_jobs(cluster, slurm_jobs, dead))
    return result


def slurm_sync_all() -> list[dict]:
    return [
        slurm_sync(cluster=cluster)
        for cluster in Cluster.objects.filter(driver=DriverName.SLURM).select_related("fleet").order_by("pk")
    ]
