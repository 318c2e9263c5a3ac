"""The events the jobs services publish: each event's topics, the payloads of jobs, faults and actions, and
the publishing of them (one event per change, or one list per batch of actions)."""

from django.utils import timezone

from controlplane import events
from jobs.models import FaultEvent, Job, RecoveryAction


def job_topics(job: Job) -> list[str]:
    """Every event about a job goes to its own topic, its cluster's, its tenant's and the fleet's."""
    return job_topics_of(job.pk, job.cluster_id, job.tenant_id)


def job_topics_of(job_id: int, cluster_id: int, tenant_id: int) -> list[str]:
    """``job_topics`` from the job's ids, for callers that have only those."""
    return [
        events.topic("job", job_id),
        events.topic("cluster", cluster_id),
        events.topic("tenant", tenant_id),
        events.topic("fleet"),
    ]


def cluster_topics(cluster_id: int, tenant_id: int | None = None) -> list[str]:
    names = [events.topic("cluster", cluster_id), events.topic("fleet")]
    if tenant_id:
        names.append(events.topic("tenant", tenant_id))
    return names


def fault_payload(fault: FaultEvent) -> dict:
    return {
        "fault": fault.pk,
        "incident": fault.incident_id,
        "kind": fault.kind,
        "xid": fault.xid,
        "severity": fault.severity,
        "state": fault.state,
        "state_reason": fault.state_reason,
        "node": fault.node_id,
        "hostname": fault.node.hostname,
        "cluster": fault.cluster_id,
        "device": fault.device,
        "sources": fault.sources,
        "detected_at": fault.detected_at.isoformat(),
        "needs_human": fault.needs_human,
        "summary": f"{fault.kind}{' ' + str(fault.xid) if fault.xid is not None else ''} on {fault.node.hostname}"
        f"{' ' + fault.device if fault.device else ''}",
    }


def action_payload(action: RecoveryAction) -> dict:
    payload = {
        "action": action.pk,
        "kind": action.kind,
        "state": action.state,
        "dry_run": action.dry_run,
        "gpus": action.gpus,
        "job": action.job_id,
        "fault": action.fault_id,
        "cluster": action.cluster_id,
        "node": action.node_id,
        "to_node": action.to_node_id,
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
        "summary": f"{action.kind.replace('_', ' ')} {action.state}"
        + (" (dry run)" if action.dry_run else ""),
        "reason": action.reason[:500],
    }
    if action.fault_id and action.fault is not None:
        payload["fault_state"] = action.fault.state
        payload["fault_summary"] = (
            f"{action.fault.kind}{' ' + str(action.fault.xid) if action.fault.xid is not None else ''}"
            f" on {action.node.hostname if action.node_id and action.node else action.fault.node_id}"
        )
    return payload


def publish_action(action: RecoveryAction, kind: str) -> None:
    if action.job_id:
        topics = job_topics(action.job)
    else:
        topics = cluster_topics(action.cluster_id, action.cluster.dedicated_tenant_id)
    events.publish(topics, kind, action_payload(action), url=f"/api/v1/actions/{action.pk}/")


def job_payload(job: Job, **extra) -> dict:
    return {
        "job": job.pk,
        "name": job.name,
        "state": job.state,
        "iteration": job.iteration_now(),
        "at": timezone.now().isoformat(),
        **extra,
    }


def publish_job(job: Job, kind: str, **extra) -> None:
    events.publish(job_topics(job), kind, job_payload(job, **extra), url=f"/api/v1/jobs/{job.pk}/")


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
        (
            [events.topic("cluster", cluster_id), events.topic("fleet")],
            kind,
            {"actions": every, "cluster": cluster_id, "summary": f"{len(every)} recovery action(s) {verb}"},
            f"/api/v1/actions/?cluster={cluster_id}",
        )
    ]
    by_tenant: dict[int, list] = {}
    by_job: dict[int, list] = {}
    for action, payload in payloads:
        by_tenant.setdefault(action.job.tenant_id, []).append(payload)
        by_job.setdefault(action.job_id, []).append(payload)
    for tenant_id, mine in sorted(by_tenant.items()):
        items.append(
            (
                [events.topic("tenant", tenant_id)],
                kind,
                {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"},
                "/api/v1/actions/",
            )
        )
    for job_id, mine in sorted(by_job.items()):
        items.append(
            (
                [events.topic("job", job_id)],
                kind,
                {"actions": mine, "summary": f"{len(mine)} recovery action(s) {verb}"},
                f"/api/v1/actions/?job={job_id}",
            )
        )
    return items
