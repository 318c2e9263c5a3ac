"""Fault intake and handling: a fault is stored first, then handled once, by a task queued on commit."""

import hashlib
import json
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Min
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from controlplane.queueing import queue
from fleet.choices import AutomationMode
from fleet.models import GPU, NIC
from jobs.choices import JOB_FAULT_KINDS, FaultKind, FaultSource, FaultState, Severity
from jobs.models import FaultEvent, JobAllocation
from jobs.placement import immediate_constraints
from jobs.services.common import cluster_topics, fault_payload, job_topics_of
from jobs.services.incidents import incident_join, incident_report
from jobs.triage import classify_fault

DEFAULT_SEVERITY = {
    FaultKind.NODE_UNREACHABLE: Severity.CRITICAL, FaultKind.GPU_XID: Severity.CRITICAL,
    FaultKind.ECC_UNCORRECTABLE: Severity.CRITICAL, FaultKind.NIC_DOWN: Severity.CRITICAL,
    FaultKind.NVLINK_ERROR: Severity.CRITICAL,
}


# The node fields fault_ingest reads, for callers that load the node just for it (the API's intake).
INGEST_NODE_FIELDS = ("id", "hostname", "rack", "cluster_id", "cluster__id", "cluster__name", "cluster__dedicated_tenant_id")


def correlation_key(*, node_id: int, kind: str, gpu_index: int | None, nic_name: str | None, xid: int | None,
                    job=None) -> str:
    """What joins reports of one fault: its node, device (a GPU, a NIC, or for a job's own failure the job), kind and
    code."""
    device = f"gpu{gpu_index}" if gpu_index is not None else (nic_name or (f"job{job}" if job is not None else ""))
    return f"{node_id}:{device}:{kind}:{'' if xid is None else xid}"


def _advisory_lock(key: str) -> None:
    """Serialise reports under one key (a node, an idempotency key) so concurrent duplicates merge, and reports of
    one failure fold into one incident, instead of racing (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return
    number = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [number])


# --- intake bounds (issue 25): what one report may carry, and what a stored fault may grow to -----------------------
MAX_DETAILS_BYTES = 16 * 1024   # a report's details, and a fault's merged details, as JSON


def _details_size(details: dict) -> int:
    return len(json.dumps(details, separators=(",", ":"), default=str))


def _request_digest(**report) -> str:
    """What an idempotency key is bound to: the report as its caller sent it (a retry sends the same)."""
    return hashlib.sha256(json.dumps(report, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()
# --- end of intake bounds -------------------------------------------------------------------------------------------


def _merge(fault_id: int, *, source: str, details: dict | None, now: datetime) -> FaultEvent:
    """Another report of a stored fault: it adds its source, and its incident counts it. Its details join the
    fault's while they stay within MAX_DETAILS_BYTES; past that the fault keeps what it had and says so."""
    fault = FaultEvent.objects.select_for_update(of=("self",), no_key=True).select_related("node").get(pk=fault_id)
    incident_report(incident_id=fault.incident_id, now=now)
    if source not in fault.sources:
        fault.sources = [*fault.sources, source]
    fault.report_count += 1
    fault.last_reported_at = now
    if details:
        merged = {**fault.details, **details}
        if _details_size(merged) <= MAX_DETAILS_BYTES:
            fault.details = merged
        else:
            fault.details = {**fault.details, "details_dropped": fault.details.get("details_dropped", 0) + 1}
    fault.save(update_fields=["sources", "report_count", "last_reported_at", "details"])
    return fault


def _validate(source, kind, severity, gpu_index, nic_name, node):
    if kind not in FaultKind.values:
        raise ServiceError(f"unknown fault kind {kind!r}", field="kind")
    if source not in FaultSource.values:
        raise ServiceError(f"unknown source {source!r}", field="source")
    if severity and severity not in Severity.values:
        raise ServiceError(f"unknown severity {severity!r}", field="severity")
    if gpu_index is not None and not GPU.objects.filter(node_id=node.pk, index=gpu_index).exists():
        raise ServiceError(f"node {node.hostname} has no GPU {gpu_index}", field="gpu_index")
    if nic_name and not NIC.objects.filter(node_id=node.pk, name=nic_name).exists():
        raise ServiceError(f"node {node.hostname} has no NIC {nic_name}", field="nic_name")


def fault_ingest(*, source: str, kind: str, node, gpu_index: int | None = None, nic_name: str | None = None,
                 xid: int | None = None, severity: str = "", detected_at=None, details: dict | None = None,
                 idempotency_key: str | None = None, actor=None) -> tuple[FaultEvent, bool]:
    """Store a fault report durably, before anything acts on it, and queue its handling on commit.

    Returns (fault, created). ``created`` is False when the report joined an existing fault: one with the
    same idempotency key, or the same node, device, kind and code within FAULT_CORRELATION_SECONDS (its
    source is added to the fault's sources). Only a new fault is handled; merging never acts twice. A new fault
    opens its node's incident or folds into the one open (jobs.services.incidents), under the node's lock.
    """
    _validate(source, kind, severity, gpu_index, nic_name, node)
    now = timezone.now()
    # --- intake bounds (issue 25) ---
    if details is not None and not isinstance(details, dict):
        raise ServiceError("must be an object", field="details")
    if details and _details_size(details) > MAX_DETAILS_BYTES:
        raise ServiceError(f"at most {MAX_DETAILS_BYTES} bytes as JSON", field="details")
    digest = _request_digest(source=source, kind=kind, node=node.pk, gpu_index=gpu_index, nic_name=nic_name or "",
                             xid=xid, severity=severity, detected_at=detected_at, details=details or {})
    oldest = now - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_HOURS)
    if detected_at is not None and detected_at < oldest:
        if source not in (FaultSource.ALERTMANAGER, FaultSource.HEARTBEAT):
            raise ServiceError(f"detected_at is older than the raw-retention period "
                               f"({settings.TELEMETRY_RAW_RETENTION_HOURS} h)", field="detected_at")
        # An alert Alertmanager kept firing for days, a node silent since before an outage: clamped and noted.
        details = {**(details or {}), "detected_at_clamped_from": detected_at.isoformat()}
        detected_at = oldest
    # --- end of intake bounds ---
    detected_at = detected_at or now
    if detected_at > now + timedelta(minutes=5):
        raise ServiceError("detected_at is in the future", field="detected_at")
    job = (details or {}).get("job") if kind in JOB_FAULT_KINDS and isinstance(details, dict) else None
    key = correlation_key(node_id=node.pk, kind=kind, gpu_index=gpu_index, nic_name=nic_name, xid=xid,
                          job=job if isinstance(job, int) else None)
    with transaction.atomic():
        immediate_constraints()
        # Reports of one node are serialised (its faults merge, its incident folds them) by one lock per node.
        _advisory_lock(idempotency_key or f"node:{node.pk}")
        if idempotency_key:
            existing, bound_to = (FaultEvent.objects.filter(idempotency_key=idempotency_key)
                                  .values_list("pk", "request_digest").first() or (None, ""))
            if existing is not None:
                if bound_to and bound_to != digest:
                    raise ServiceError("this Idempotency-Key was used for a different report", status=409)
                return _merge(existing, source=source, details=details, now=now), False
            _advisory_lock(f"node:{node.pk}")
        window = timedelta(seconds=settings.FAULT_CORRELATION_SECONDS)
        existing = (FaultEvent.objects.filter(correlation_key=key, received_at__gte=now - window)
                    .order_by("-received_at").values_list("pk", flat=True).first())
        if existing is not None:
            return _merge(existing, source=source, details=details, now=now), False
        verdict = classify_fault(kind, xid=xid, details=details)
        try:
            # The node's lock already serialises reports with this key; the savepoint only guards other writers.
            with transaction.atomic(savepoint=bool(idempotency_key)):
                fault = FaultEvent(
                    kind=kind, xid=xid, severity=severity or DEFAULT_SEVERITY.get(kind, Severity.WARNING),
                    cluster_id=node.cluster_id, node=node, gpu_index=gpu_index, nic_name=nic_name or "",
                    rack=node.rack, sources=[source], detected_at=detected_at, received_at=now,
                    last_reported_at=now, triage=verdict.as_dict(), needs_human=verdict.needs_human,
                    correlation_key=key, idempotency_key=idempotency_key or None, details=details or {},
                    request_digest=digest if idempotency_key else None,
                )
                incident_join(fault=fault, fatal=verdict.out_of_service, now=now)
                fault.save(force_insert=True)
        except IntegrityError:
            existing = FaultEvent.objects.values_list("pk", flat=True).get(idempotency_key=idempotency_key)
            return _merge(existing, source=source, details=details, now=now), False
        fault.node = node
        tenant_id = node.cluster.dedicated_tenant_id if hasattr(node, "cluster") else None
        audit_record(actor=actor, action="fault.ingest", target=fault, tenant_id=tenant_id,
                     changes={"source": source, "kind": kind, "xid": xid, "triage": verdict.explanation})
        topics = cluster_topics(fault.cluster_id, tenant_id)
        for job_id, job_cluster_id, job_tenant_id in (JobAllocation.objects.filter(node=node, released_at__isnull=True)
                                                      .values_list("job_id", "job__cluster_id", "job__tenant_id")):
            topics += job_topics_of(job_id, job_cluster_id, job_tenant_id)
        fault_id = fault.pk
        # Queue the handling first, then relay the event: the decision should not wait for the relay.
        transaction.on_commit(lambda: _enqueue(fault_id))
        events.publish(topics, "fault.reported", fault_payload(fault), url=f"/api/v1/faults/{fault.pk}/")
    return fault, True


def _enqueue(fault_id: int) -> None:
    from jobs.tasks import fault_handle_task

    queue(fault_handle_task, fault_id)   # the broker away: the fault is stored, and the fault sweep queues it


def fault_handle(*, fault_id: int) -> list[int]:
    """Decide and start the recovery for a fault (and any other new faults of its cluster, as one global
    decision). Idempotent: a fault that is no longer new is left alone; returns the ids of actions created."""
    from jobs.services.recovery import decide

    with transaction.atomic():
        # A fault whose row is locked is being decided right now (it joined another fault's batch): that
        # handler settles it, or rolls back and leaves it new for the sweep. Waiting for it would only queue up.
        fault = (FaultEvent.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
                 .filter(pk=fault_id).first())
        if fault is None or fault.state != FaultState.NEW:
            return []
        from jobs.placement import _skip_locked, lock_cluster

        cluster = lock_cluster(fault.cluster_id)
        mode = cluster.effective_automation
        if mode == AutomationMode.PAUSED:
            reason = f"held: automation is paused (provider-wide, or on {cluster.name} or its fleet)"
            if fault.state_reason != reason:
                FaultEvent.objects.filter(pk=fault.pk).update(state_reason=reason)
            return []
        others = list(_skip_locked(FaultEvent.objects.filter(cluster=cluster, state=FaultState.NEW)
                                   .exclude(pk=fault.pk).order_by("received_at"))[:200])
        return decide(cluster=cluster, faults=[fault, *others], dry_run=mode == AutomationMode.DRY_RUN)


def fault_sweep(*, min_age_seconds: float | None = None) -> int:
    """Nudge the clusters that still have faults new after a few seconds (a message was lost, or a worker died);
    faults held by paused automation stay where they are. A decision takes every new fault of its cluster, so one
    task per cluster (for its oldest such fault) is enough: re-queueing every fault would, under a backlog, flood
    the queue with tasks that each find their fault already decided. Returns how many tasks were queued."""
    age = settings.FAULT_SWEEP_SECONDS if min_age_seconds is None else min_age_seconds
    cutoff = timezone.now() - timedelta(seconds=age)
    from django.db.models import Exists

    from fleet.models import AutomationSwitch

    rows = (FaultEvent.objects.filter(state=FaultState.NEW, received_at__lte=cutoff)
            .exclude(cluster__automation=AutomationMode.PAUSED).exclude(cluster__fleet__automation=AutomationMode.PAUSED)
            .exclude(Exists(AutomationSwitch.objects.filter(mode=AutomationMode.PAUSED)))   # the provider switch
            .values("cluster_id").annotate(oldest=Min("id")).order_by("oldest").values_list("oldest", flat=True))
    ids = list(rows)
    for fault_id in ids:
        _enqueue(fault_id)
    return len(ids)

