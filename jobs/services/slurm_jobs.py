"""Lockstep follows its Slurm clusters: nodes and jobs as Slurm reports them (beat: ``jobs.slurm_sync``).

Nodes: a node Slurm lists that Lockstep does not know is added (its GPUs from gres, a spare when it is idle in
the connection's ``spare_partition``, cordoned or failed when Slurm holds it out). A node Slurm marks ``down`` or
``not_responding`` that Lockstep still counts in service becomes a fault (source ``slurm``, node_unreachable),
which joins the node's incident with the agent's and Alertmanager's reports; what Lockstep does about it (drain
with its reason, requeue the job without the node) is the fault path's. Lockstep's own node states (cordoned,
draining, failed, spare) are never overwritten from Slurm once the node is known: the escalation ladder owns them.

Jobs: a running Slurm job Lockstep does not follow yet is adopted (``jobs.launchers.slurm_job_adopt``: tenant by
account mapping; unmapped accounts are listed in the result, provider only). A followed job that Slurm reports
ended moves the Lockstep job: completed → Completed, cancelled → Cancelled, failed (failed, node_fail, timeout,
out_of_memory, …) → Failed — unless a recovery of it is under way or one of its nodes has an open incident, when
the fault path decides (it requeues the job). A job requeued by Slurm itself stays as it is until it runs again.
"""

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.errors import ServiceError
from fleet.choices import DriverName, NodeState
from fleet.drivers import DriverError
from fleet.drivers.slurm import SlurmDriver, gpus_of, node_condition
from fleet.models import GPU, Cluster, Node
from jobs.choices import (
    ACTIVE_ACTION_STATES,
    ACTIVE_JOB_STATES,
    FaultKind,
    FaultSource,
    IncidentState,
    JobState,
)
from jobs.launchers import slurm_job_adopt
from jobs.models import Incident, Job, RecoveryAction, SlurmJob
from jobs.services.common import publish_job
from jobs.services.faults import fault_ingest
from jobs.services.jobs import _stop, job_fail

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


def sync_jobs(cluster: Cluster, slurm_jobs: list[dict], dead: frozenset[str] = frozenset()) -> dict:
    """``dead``: hosts Slurm reports down or not responding; a job that ended on one is the fault path's."""
    by_id = {str(j.get("job_id")): j for j in slurm_jobs}
    links = {
        link.slurm_job_id: link for link in SlurmJob.objects.filter(cluster=cluster).select_related("job")
    }
    adopted, unmapped, ended = [], [], {}
    now = timezone.now()
    for slurm_id, slurm_job in by_id.items():
        state = slurm_job.get("job_state", "")
        link = links.get(slurm_id)
        if link is None:
            if state != "RUNNING":
                continue
            try:
                link = slurm_job_adopt(cluster=cluster, slurm_job=slurm_job)
                adopted.append(slurm_id)
            except ServiceError as error:
                unmapped.append(
                    {"slurm_job_id": slurm_id, "account": slurm_job.get("account", ""), "why": error.detail}
                )
            continue
        link.slurm_state, link.seen_at = state[:30], now
        link.restart_count = max(link.restart_count, int(slurm_job.get("restart_cnt") or 0))
        if state == "RUNNING":
            link.nodes = (slurm_job.get("nodes") or "")[:300]
        link.save(update_fields=["slurm_state", "seen_at", "restart_count", "nodes"])
        if (state in ENDED or state in FAILED) and not dead.intersection(_hosts(slurm_job)):
            moved = _end(link, state)
            if moved:
                ended[slurm_id] = moved
    for slurm_id, link in links.items():
        if slurm_id not in by_id and link.job.state in ACTIVE_JOB_STATES and link.slurm_state != "GONE":
            link.slurm_state = "GONE"
            link.save(update_fields=["slurm_state"])
            moved = _end(link, "FAILED")
            if moved:
                ended[slurm_id] = moved
    return {"adopted": adopted, "unmapped": unmapped, "ended": ended}


def _hosts(slurm_job: dict) -> set[str]:
    from jobs.launchers import hostnames_of

    return set(hostnames_of(slurm_job))


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
