"""What the jobs services share: topics, event payloads, phases, protection and driver estimates."""

import functools
import operator

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from controlplane import events
from fleet.drivers import driver_for
from fleet.selectors import cluster_protection
from jobs.choices import JobPhaseKind
from jobs.models import FaultEvent, Job, JobPhase, JobProgress, RecoveryAction


def job_topics(job: Job) -> list[str]:
    """Every event about a job goes to its own topic, its cluster's, its tenant's and the fleet's."""
    return job_topics_of(job.pk, job.cluster_id, job.tenant_id)


def job_topics_of(job_id: int, cluster_id: int, tenant_id: int) -> list[str]:
    """``job_topics`` from the job's ids, for callers that have only those."""
    return [events.topic("job", job_id), events.topic("cluster", cluster_id),
            events.topic("tenant", tenant_id), events.topic("fleet")]


def cluster_topics(cluster_id: int, tenant_id: int | None = None) -> list[str]:
    names = [events.topic("cluster", cluster_id), events.topic("fleet")]
    if tenant_id:
        names.append(events.topic("tenant", tenant_id))
    return names


def fault_payload(fault: FaultEvent) -> dict:
    return {
        "fault": fault.pk, "incident": fault.incident_id, "kind": fault.kind, "xid": fault.xid, "severity": fault.severity, "state": fault.state,
        "state_reason": fault.state_reason, "node": fault.node_id, "hostname": fault.node.hostname,
        "cluster": fault.cluster_id, "device": fault.device, "sources": fault.sources,
        "detected_at": fault.detected_at.isoformat(), "needs_human": fault.needs_human,
        "summary": f"{fault.kind}{' ' + str(fault.xid) if fault.xid is not None else ''} on {fault.node.hostname}"
                   f"{' ' + fault.device if fault.device else ''}",
    }


def action_payload(action: RecoveryAction) -> dict:
    payload = {
        "action": action.pk, "kind": action.kind, "state": action.state, "dry_run": action.dry_run, "gpus": action.gpus,
        "job": action.job_id, "fault": action.fault_id, "cluster": action.cluster_id,
        "node": action.node_id, "to_node": action.to_node_id,
        "detected_at": action.detected_at.isoformat(),
        "planned_at": action.planned_at.isoformat(),
        "started_at": action.started_at.isoformat() if action.started_at else None,
        "ended_at": action.ended_at.isoformat() if action.ended_at else None,
        "pause_seconds": round(action.pause_seconds, 3),
        "work_lost_seconds": round(action.work_lost_seconds, 3),
        "snapshot_overhead_seconds": round(action.snapshot_overhead_seconds, 3),
        "gpu_hours_lost": round(action.gpu_hours_lost, 4),
        "gpu_hours_baseline": round(action.gpu_hours_baseline, 4),
        "gpu_hours_saved": round(action.gpu_hours_saved, 4),
        "restore_iteration": action.restore_iteration,
        "summary": f"{action.kind.replace('_', ' ')} {action.state}" + (" (dry run)" if action.dry_run else ""),
        "reason": action.reason[:500],
    }
    if action.fault_id and action.fault is not None:
        payload["fault_state"] = action.fault.state
        payload["fault_summary"] = (f"{action.fault.kind}{' ' + str(action.fault.xid) if action.fault.xid is not None else ''}"
                                    f" on {action.node.hostname if action.node_id and action.node else action.fault.node_id}")
    return payload


def publish_action(action: RecoveryAction, kind: str) -> None:
    if action.job_id:
        topics = job_topics(action.job)
    else:
        topics = cluster_topics(action.cluster_id, action.cluster.dedicated_tenant_id)
    events.publish(topics, kind, action_payload(action), url=f"/api/v1/actions/{action.pk}/")


def job_payload(job: Job, **extra) -> dict:
    return {"job": job.pk, "name": job.name, "state": job.state, "iteration": job.iteration_now(),
            "at": timezone.now().isoformat(), **extra}


def publish_job(job: Job, kind: str, **extra) -> None:
    events.publish(job_topics(job), kind, job_payload(job, **extra), url=f"/api/v1/jobs/{job.pk}/")


def phase_family(kind: str) -> list[str]:
    """The phases a new phase of this kind ends: a job has one open phase at a time (running or recovering),
    plus at most one open degraded phase."""
    return [kind] if kind == JobPhaseKind.DEGRADED else [JobPhaseKind.RUNNING, JobPhaseKind.RECOVERING]


def phase_start(job: Job, kind: str, reason: str = "", at=None) -> None:
    """End the open phase of this kind family and open a new one."""
    at = at or timezone.now()
    phases_switch(at=at, ended=[(job.pk, phase_family(kind))],
                  started=[JobPhase(job=job, kind=kind, started_at=at, reason=reason[:200])], progress=[])


def phase_end(job: Job, kinds=None, at=None) -> None:
    rows = JobPhase.objects.filter(job=job, ended_at__isnull=True)
    if kinds:
        rows = rows.filter(kind__in=kinds)
    rows.update(ended_at=at or timezone.now())


def phases_switch(*, at, ended: list[tuple[int, list[str]]], started: list[JobPhase],
                  progress: list[JobProgress]) -> None:
    """For a batch of jobs at once: end their open phases of the given kinds (``(job id, kinds)``), open the
    ``started`` phases and record ``progress``. A decision and a batch of completions do all three for every
    job they touch; on PostgreSQL it is one statement (two data-modifying CTEs and an INSERT)."""
    pairs = [(job_id, kind) for job_id, kinds in ended for kind in kinds]
    if connection.vendor != "postgresql":
        if pairs:
            JobPhase.objects.filter(functools.reduce(operator.or_, [Q(job_id=j, kind=k) for j, k in pairs]),
                                    ended_at__isnull=True).update(ended_at=at)
        JobPhase.objects.bulk_create(started)
        JobProgress.objects.bulk_create(progress)
        return
    phase, points = JobPhase._meta.db_table, JobProgress._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH ended AS (UPDATE {phase} AS p SET ended_at = %s FROM unnest(%s::bigint[], %s::text[]) AS e(job_id, kind) "
            f"WHERE p.job_id = e.job_id AND p.kind = e.kind AND p.ended_at IS NULL), "
            f"opened AS (INSERT INTO {phase} (job_id, kind, started_at, ended_at, reason, node_id, nic_name) "
            f"SELECT * FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::text[], "
            f"%s::bigint[], %s::text[])) "
            f"INSERT INTO {points} (job_id, at, iteration, step_seconds, checkpoint) "
            f"SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::bigint[], %s::float8[], %s::bool[])",
            [at, [j for j, _ in pairs], [k for _, k in pairs],
             [p.job_id for p in started], [p.kind for p in started], [p.started_at for p in started],
             [p.ended_at for p in started], [p.reason for p in started], [p.node_id for p in started],
             [p.nic_name for p in started],
             [p.job_id for p in progress], [p.at for p in progress], [p.iteration for p in progress],
             [p.step_seconds for p in progress], [p.checkpoint for p in progress]])


def record_progress(job: Job, *, at=None, iteration: int | None = None, step_seconds=None, checkpoint=False) -> None:
    JobProgress.objects.create(job=job, at=at or timezone.now(),
                               iteration=job.iteration_now(at) if iteration is None else iteration,
                               step_seconds=step_seconds, checkpoint=checkpoint)


_protection_cache: dict[int, tuple[float, object]] = {}


def protection_of(cluster, *, max_age: float = 0.0):
    """cluster_protection for a cluster (fleet.selectors), optionally cached for ``max_age`` seconds."""
    import time

    if max_age:
        hit = _protection_cache.get(cluster.pk)
        if hit and time.monotonic() - hit[0] < max_age:
            return hit[1]
    found = cluster_protection(cluster=cluster)
    _protection_cache[cluster.pk] = (time.monotonic(), found)
    return found


def supported_operations(cluster) -> frozenset[str]:
    """Action kinds the cluster's driver can carry out."""
    from fleet.drivers.base import Operation

    ops = driver_for(cluster).supports
    # Restart from checkpoint is always possible: without driver support the job's own launcher restarts it.
    kinds = {"restart_from_checkpoint"}
    if Operation.NIC_FAILOVER in ops:
        kinds.add("nic_failover")
    if Operation.MIGRATE_WORKER in ops:
        kinds |= {"live_migration", "intra_node_migration", "proactive_migration"}
    if Operation.GPU_RESET in ops:
        kinds.add("gpu_reset")
    if Operation.RESTORE_FROM_SNAPSHOT in ops:
        kinds.add("restore_from_snapshot")
    if Operation.RELAUNCH_WITHOUT_NODE in ops:
        kinds.add("proactive_migration")   # written through, then relaunched without the node (jobs.services.moves)
    return frozenset(kinds)
def decision_lists(cluster, created: list[RecoveryAction], started: set[int]) -> list[events.Item]:
    """A decision's actions as ``actions.decided`` lists (see ``action_lists``)."""
    if not created:
        return []
    payloads = []
    for action in created:
        kind = "action.started" if action.pk in started else "action.planned"
        payloads.append((action, {**action_payload(action), "event": kind}))
    return action_lists(cluster.pk, payloads, "actions.decided", "decided")


def action_lists(cluster_id: int, payloads: list, kind: str, verb: str) -> list[events.Item]:
    """Events listing a batch of actions: all of them on the cluster's and the fleet's topics, each tenant's own
    on that tenant's topic, and each job's own on the job's topic (no tenant ever sees another's). Fewer, larger
    events, all written by one ``publish_many``: the topics' shared sequence rows are taken once, together, in
    one global order, and held only for the moment before COMMIT."""
    every = [p for _, p in payloads]
    items: list[events.Item] = [
        ([events.topic("cluster", cluster_id), events.topic("fleet")], kind,
         {"actions": every, "cluster": cluster_id, "summary": f"{len(every)} recovery action(s) {verb}"},
         f"/api/v1/actions/?cluster={cluster_id}")]
    by_tenant: dict[int, list] = {}
    by_job: dict[int, list] = {}
    for action, payload in payloads:
        by_tenant.setdefault(action.job.tenant_id, []).append(payload)
        by_job.setdefault(action.job_id, []).append(payload)
    for tenant_id, mine in sorted(by_tenant.items()):
        items.append(([events.topic("tenant", tenant_id)], kind,
                      {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"}, "/api/v1/actions/"))
    for job_id, mine in sorted(by_job.items()):
        items.append(([events.topic("job", job_id)], kind,
                      {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"},
                      f"/api/v1/actions/?job={job_id}"))
    return items


