"""Fault intake and handling: a fault is stored first, then handled once, by a task queued on commit."""

import hashlib
import json
import logging
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import Min
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_entry, audit_record_many
from controlplane.bulk import insert_rows, update_rows
from controlplane.errors import ServiceError
from controlplane.prepared import PreparedQuery
from controlplane.queueing import queue
from fleet.choices import AutomationMode
from fleet.models import GPU, NIC
from jobs.choices import INTERNAL_FAULT_KINDS, JOB_FAULT_KINDS, FaultKind, FaultSource, FaultState, Severity
from jobs.models import FaultEvent, JobAllocation
from jobs.placement import immediate_constraints
from jobs.services.incidents import incident_join, incident_join_many, incident_report
from jobs.services.publishing import cluster_topics, fault_payload, job_topics_of
from jobs.triage import FaultVerdict, classify_fault

log = logging.getLogger(__name__)

DEFAULT_SEVERITY = {
    FaultKind.NODE_UNREACHABLE: Severity.CRITICAL,
    FaultKind.GPU_XID: Severity.CRITICAL,
    FaultKind.ECC_UNCORRECTABLE: Severity.CRITICAL,
    FaultKind.NIC_DOWN: Severity.CRITICAL,
    FaultKind.NVLINK_ERROR: Severity.CRITICAL,
}


def correlation_key(
    *, node_id: int, kind: str, gpu_index: int | None, nic_name: str | None, xid: int | None, job=None
) -> str:
    """What joins reports of one fault: its node, device (a GPU, a NIC, or for a job's own failure the job), kind and
    code."""
    device = (
        f"gpu{gpu_index}" if gpu_index is not None else (nic_name or (f"job{job}" if job is not None else ""))
    )
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
MAX_DETAILS_BYTES = 16 * 1024  # a report's details, and a fault's merged details, as JSON


def _details_size(details: dict) -> int:
    return len(json.dumps(details, separators=(",", ":"), default=str))


def _request_digest(**report) -> str:
    """What an idempotency key is bound to: the report as its caller sent it (a retry sends the same)."""
    return hashlib.sha256(
        json.dumps(report, sort_keys=True, separators=(",", ":"), default=str).encode()
    ).hexdigest()


# --- end of intake bounds -------------------------------------------------------------------------------------------


def _merge(fault_id: int, *, source: str, details: dict | None, now: datetime) -> FaultEvent:
    """Another report of a stored fault: it adds its source, and its incident counts it. Its details join the
    fault's while they stay within MAX_DETAILS_BYTES; past that the fault keeps what it had and says so."""
    fault = _FOR_MERGE.first(pk=fault_id)
    if fault is None:
        raise FaultEvent.DoesNotExist(f"fault {fault_id} is gone")
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
    update_rows([fault], ["sources", "report_count", "last_reported_at", "details"])
    return fault


def _validate_values(source, kind, severity) -> None:
    if kind not in FaultKind.values:
        raise ServiceError(f"unknown fault kind {kind!r}", field="kind")
    if source not in FaultSource.values:
        raise ServiceError(f"unknown source {source!r}", field="source")
    if (kind in INTERNAL_FAULT_KINDS) != (source == FaultSource.LOCKSTEP):
        raise ServiceError(
            f"only Lockstep raises {kind!r} (it drains nodes through their node actions)"
            if kind in INTERNAL_FAULT_KINDS
            else f"source {source!r} is Lockstep's own",
            field="kind" if kind in INTERNAL_FAULT_KINDS else "source",
        )
    if severity and severity not in Severity.values:
        raise ServiceError(f"unknown severity {severity!r}", field="severity")


# The reads of every single report, compiled once per process (controlplane/prepared.py).
_CORRELATED = PreparedQuery(
    lambda key, since: (
        FaultEvent.objects.filter(correlation_key=key, received_at__gte=since)
        .order_by("-received_at")
        .values_list("pk")[:1]
    ),
    key=str,
    since=datetime,
)
# A stored fault another report merges into, locked for the merge (the lock leaves its key alone: no_key).
_FOR_MERGE = PreparedQuery(
    lambda pk: (
        FaultEvent.objects.select_for_update(of=("self",), no_key=True).select_related("node").filter(pk=pk)
    ),
    pk=int,
)
_WAITING = PreparedQuery(
    lambda cluster: (
        FaultEvent.objects.filter(cluster_id=cluster, state=FaultState.NEW)
        .order_by("received_at")
        .values_list("pk")[:1]
    ),
    cluster=int,
)


# (node, job, the job's cluster, its tenant) for the jobs holding these nodes.
_JOBS_ON = PreparedQuery(
    lambda nodes: JobAllocation.objects.filter(node_id__in_array=nodes, released_at__isnull=True).values_list(
        "node_id", "job_id", "job__cluster_id", "job__tenant_id"
    ),
    nodes=list[int],
)
# A batch's reads (fault_ingest_many): any number of devices, nodes and keys, one statement text each.
_GPUS_OF = PreparedQuery(
    lambda nodes, indexes: GPU.objects.filter(node_id__in_array=nodes, index__in_array=indexes).values_list(
        "node_id", "index"
    ),
    nodes=list[int],
    indexes=list[int],
)
_NICS_OF = PreparedQuery(
    lambda nodes, names: NIC.objects.filter(node_id__in_array=nodes, name__in_array=names).values_list(
        "node_id", "name"
    ),
    nodes=list[int],
    names=list[str],
)
_LATEST_CORRELATED = PreparedQuery(
    lambda keys, since: (
        FaultEvent.objects.filter(correlation_key__in_array=keys, received_at__gte=since)
        .order_by("received_at")
        .values_list("correlation_key", "pk")
    ),
    keys=list[str],
    since=datetime,
)


def _validate(source, kind, severity, gpu_index, nic_name, node):
    _validate_values(source, kind, severity)
    _devices_exist([FaultReport(kind=kind, node=node, gpu_index=gpu_index, nic_name=nic_name)])


def _bounded(*, source: str, details, detected_at, now: datetime) -> tuple[dict | None, datetime]:
    """A report's details and detection time within the intake bounds (issue 25): too large or in the future is
    refused; older than the raw retention is refused, or clamped for Alertmanager and heartbeats."""
    if details is not None and not isinstance(details, dict):
        raise ServiceError("must be an object", field="details")
    if details and _details_size(details) > MAX_DETAILS_BYTES:
        raise ServiceError(f"at most {MAX_DETAILS_BYTES} bytes as JSON", field="details")
    oldest = now - timedelta(hours=settings.TELEMETRY_RAW_RETENTION_HOURS)
    if detected_at is not None and detected_at < oldest:
        if source not in (FaultSource.ALERTMANAGER, FaultSource.HEARTBEAT):
            raise ServiceError(
                f"detected_at is older than the raw-retention period "
                f"({settings.TELEMETRY_RAW_RETENTION_HOURS} h)",
                field="detected_at",
            )
        # An alert Alertmanager kept firing for days, a node silent since before an outage: clamped and noted.
        details = {**(details or {}), "detected_at_clamped_from": detected_at.isoformat()}
        detected_at = oldest
    detected_at = detected_at or now
    if detected_at > now + timedelta(minutes=5):
        raise ServiceError("detected_at is in the future", field="detected_at")
    return details, detected_at


def _key_of(*, node, kind: str, gpu_index, nic_name, xid, details) -> str:
    job = (details or {}).get("job") if kind in JOB_FAULT_KINDS and isinstance(details, dict) else None
    return correlation_key(
        node_id=node.pk,
        kind=kind,
        gpu_index=gpu_index,
        nic_name=nic_name,
        xid=xid,
        job=job if isinstance(job, int) else None,
    )


def _new_fault(
    *,
    source: str,
    kind: str,
    node,
    gpu_index,
    nic_name,
    xid,
    severity,
    detected_at,
    details,
    key: str,
    now: datetime,
    idempotency_key: str | None = None,
    digest: str | None = None,
) -> tuple[FaultEvent, FaultVerdict]:
    """A new fault, unsaved; and its triage's verdict. The caller joins it to its node's incident."""
    verdict = classify_fault(kind, xid=xid, details=details)
    fault = FaultEvent(
        kind=kind,
        xid=xid,
        severity=severity or DEFAULT_SEVERITY.get(kind, Severity.WARNING),
        cluster_id=node.cluster_id,
        node=node,
        gpu_index=gpu_index,
        nic_name=nic_name or "",
        rack=node.rack,
        sources=[source],
        detected_at=detected_at,
        received_at=now,
        last_reported_at=now,
        triage=verdict.as_dict(),
        needs_human=verdict.needs_human,
        correlation_key=key,
        idempotency_key=idempotency_key or None,
        details=details or {},
        request_digest=digest if idempotency_key else None,
    )
    return fault, verdict


def _announce(faults: list[tuple[FaultEvent, str, str, int | None]], *, actor) -> None:
    """What follows storing new faults, for all of them together: their audit entries, one statement; their
    ``fault.reported`` events on their cluster's and their jobs' topics, one statement; their handling, queued on
    commit once per cluster. Each item is (fault, source, triage explanation, the cluster's dedicated tenant)."""
    if not faults:
        return
    audit_record_many(
        [
            audit_entry(
                actor=actor,
                action="fault.ingest",
                target=fault,
                tenant_id=tenant_id,
                changes={"source": source, "kind": fault.kind, "xid": fault.xid, "triage": why},
            )
            for fault, source, why, tenant_id in faults
        ]
    )
    jobs: dict[int, list[str]] = {}
    for node_id, job_id, job_cluster_id, job_tenant_id in _jobs_on({fault.node_id for fault, *_ in faults}):
        jobs.setdefault(node_id, []).extend(job_topics_of(job_id, job_cluster_id, job_tenant_id))
    clusters = {}
    for fault, *_ in faults:
        clusters.setdefault(fault.cluster_id, fault.pk)
    # Queue the handling first, then relay the events: the decision should not wait for the relay.
    transaction.on_commit(
        lambda: [_enqueue(fault_id, cluster_id) for cluster_id, fault_id in clusters.items()]
    )
    events.publish_many(
        [
            (
                cluster_topics(fault.cluster_id, tenant_id) + jobs.get(fault.node_id, []),
                "fault.reported",
                fault_payload(fault),
                f"/api/v1/faults/{fault.pk}/",
            )
            for fault, _, _, tenant_id in faults
        ]
    )


def _jobs_on(node_ids: set[int]) -> list[tuple[int, int, int, int | None]]:
    """(node, job, the job's cluster, its tenant) for the jobs holding these nodes."""
    return _JOBS_ON.rows(nodes=sorted(node_ids))


def _tenant_of(node) -> int | None:
    return node.cluster.dedicated_tenant_id if hasattr(node, "cluster") else None


def _correlation_since(now: datetime) -> datetime:
    """The earliest receipt a report at ``now`` still joins (FAULT_CORRELATION_SECONDS)."""
    return now - timedelta(seconds=settings.FAULT_CORRELATION_SECONDS)


def _fault_with_key(idempotency_key: str, digest: str) -> int | None:
    """The fault stored under this Idempotency-Key, or None; a ServiceError (409) when it was stored for a report
    other than the one ``digest`` describes."""
    existing, bound_to = FaultEvent.objects.filter(idempotency_key=idempotency_key).values_list(
        "pk", "request_digest"
    ).first() or (None, "")
    if existing is not None and bound_to and bound_to != digest:
        raise ServiceError("this Idempotency-Key was used for a different report", status=409)
    return existing


def _correlated_fault(key: str, now: datetime) -> int | None:
    """The latest fault with this correlation key received within the correlation window, or None."""
    row = _CORRELATED.first(key=key, since=_correlation_since(now))
    return row[0] if row else None


def fault_ingest(
    *,
    source: str,
    kind: str,
    node,
    gpu_index: int | None = None,
    nic_name: str | None = None,
    xid: int | None = None,
    severity: str = "",
    detected_at=None,
    details: dict | None = None,
    idempotency_key: str | None = None,
    actor=None,
) -> tuple[FaultEvent, bool]:
    """Store a fault report durably, before anything acts on it, and queue its handling on commit.

    Returns (fault, created). ``created`` is False when the report joined an existing fault: one with the
    same idempotency key, or the same node, device, kind and code within FAULT_CORRELATION_SECONDS (its
    source is added to the fault's sources). Only a new fault is handled; merging never acts twice. A new fault
    opens its node's incident or folds into the one open (jobs.services.incidents), under the node's lock.
    """
    _validate(source, kind, severity, gpu_index, nic_name, node)
    now = timezone.now()
    digest = _request_digest(
        source=source,
        kind=kind,
        node=node.pk,
        gpu_index=gpu_index,
        nic_name=nic_name or "",
        xid=xid,
        severity=severity,
        detected_at=detected_at,
        details=details or {},
    )
    details, detected_at = _bounded(source=source, details=details, detected_at=detected_at, now=now)
    key = _key_of(node=node, kind=kind, gpu_index=gpu_index, nic_name=nic_name, xid=xid, details=details)
    with transaction.atomic():
        immediate_constraints()
        # Reports of one node are serialised (its faults merge, its incident folds them) by one lock per node.
        _advisory_lock(idempotency_key or f"node:{node.pk}")
        if idempotency_key:
            existing = _fault_with_key(idempotency_key, digest)
            if existing is not None:
                return _merge(existing, source=source, details=details, now=now), False
            _advisory_lock(f"node:{node.pk}")
        existing = _correlated_fault(key, now)
        if existing is not None:
            return _merge(existing, source=source, details=details, now=now), False
        try:
            # The node's lock already serialises reports with this key; the savepoint only guards other writers.
            with transaction.atomic(savepoint=bool(idempotency_key)):
                fault, verdict = _new_fault(
                    source=source,
                    kind=kind,
                    node=node,
                    gpu_index=gpu_index,
                    nic_name=nic_name,
                    xid=xid,
                    severity=severity,
                    detected_at=detected_at,
                    details=details,
                    key=key,
                    now=now,
                    idempotency_key=idempotency_key,
                    digest=digest,
                )
                incident_join(fault=fault, fatal=verdict.out_of_service, now=now)
                insert_rows([fault])
        except IntegrityError:
            # Only a report with a key has a savepoint and a race to lose; anything else is a value the database
            # refuses, and the caller's to handle (the transaction cannot go on).
            if not idempotency_key:
                raise
            existing = FaultEvent.objects.values_list("pk", flat=True).get(idempotency_key=idempotency_key)
            return _merge(existing, source=source, details=details, now=now), False
        fault.node = node
        _announce([(fault, source, verdict.explanation, _tenant_of(node))], actor=actor)
    return fault, True


class FaultReport(NamedTuple):
    """One report for ``fault_ingest_many``: what ``fault_ingest`` takes, less the source and the idempotency key."""

    kind: str
    node: object
    gpu_index: int | None = None
    nic_name: str | None = None
    xid: int | None = None
    severity: str = ""
    detected_at: datetime | None = None
    details: dict | None = None


def _prepared_reports(
    source: str, reports: list[FaultReport], now: datetime
) -> list[tuple[FaultReport, dict | None, datetime, str]]:
    """Each report checked (a ServiceError refuses the batch) with its bounded details and detection time and its
    correlation key, in order: ``(report, details, detected_at, key)``."""
    prepared = []
    for report in reports:
        _validate_values(source, report.kind, report.severity)
        details, detected_at = _bounded(
            source=source, details=report.details, detected_at=report.detected_at, now=now
        )
        key = _key_of(
            node=report.node,
            kind=report.kind,
            gpu_index=report.gpu_index,
            nic_name=report.nic_name,
            xid=report.xid,
            details=details,
        )
        prepared.append((report, details, detected_at, key))
    return prepared


def _latest_correlated(keys: set[str], now: datetime) -> dict[str, int]:
    """For each of these correlation keys with a fault received within the correlation window, the latest one's
    id (one statement)."""
    existing: dict[str, int] = {}
    for correlation, pk in _LATEST_CORRELATED.rows(keys=sorted(keys), since=_correlation_since(now)):
        existing[correlation] = pk  # the latest of each key, as fault_ingest takes
    return existing


def fault_ingest_many(
    *, source: str, reports: list[FaultReport], actor=None
) -> list[tuple[FaultEvent, bool]]:
    """``fault_ingest`` for several reports at once (an agent's batch: a node's eight NICs going down together), in
    one transaction: the same rules and the same result for each report, in order, but its devices checked, its
    nodes locked, its correlated faults looked up, its new faults stored, audited and published together, and their
    handling queued once per cluster. A report refused refuses them all (ServiceError), as a batch is one request."""
    if not reports:
        return []
    now = timezone.now()
    prepared = _prepared_reports(source, reports, now)
    _devices_exist([report for report, *_ in prepared])
    results: list[tuple[FaultEvent, bool] | None] = []
    with transaction.atomic():
        immediate_constraints()
        for node_id in sorted(
            {report.node.pk for report in reports}
        ):  # in one order: two batches never cross
            _advisory_lock(f"node:{node_id}")
        existing = _latest_correlated({key for *_, key in prepared}, now)
        pending: list[tuple[int, FaultEvent, FaultVerdict]] = []  # (index in results, new fault, its triage)
        stored: list[tuple[FaultEvent, str, str, int | None]] = []

        def store_pending():
            by_node: dict[int, list[tuple[FaultEvent, bool]]] = {}
            for _, fault, verdict in pending:
                by_node.setdefault(fault.node_id, []).append((fault, verdict.out_of_service))
            for node_faults in by_node.values():
                incident_join_many(faults=node_faults, now=now)
            insert_rows([fault for _, fault, _ in pending])
            for index, fault, verdict in pending:
                existing[fault.correlation_key] = fault.pk
                results[index] = (fault, True)
                stored.append((fault, source, verdict.explanation, _tenant_of(fault.node)))
            pending.clear()

        for report, details, detected_at, key in prepared:
            if any(fault.correlation_key == key for _, fault, _ in pending):
                store_pending()  # a second report of a fault this batch opened merges into the stored row
            if key in existing:
                results.append((_merge(existing[key], source=source, details=details, now=now), False))
                continue
            fault, verdict = _new_fault(
                source=source,
                kind=report.kind,
                node=report.node,
                gpu_index=report.gpu_index,
                nic_name=report.nic_name,
                xid=report.xid,
                severity=report.severity,
                detected_at=detected_at,
                details=details,
                key=key,
                now=now,
            )
            pending.append((len(results), fault, verdict))
            results.append(None)
        store_pending()
        _announce(stored, actor=actor)
    return results


def _devices_exist(reports: list[FaultReport]) -> None:
    """The GPUs and NICs the reports name exist on their nodes (one statement for each kind of device)."""
    gpus = {(r.node.pk, r.gpu_index) for r in reports if r.gpu_index is not None}
    nics = {(r.node.pk, r.nic_name) for r in reports if r.nic_name}
    if gpus:
        found = set(_GPUS_OF.rows(nodes=sorted({n for n, _ in gpus}), indexes=sorted({i for _, i in gpus})))
        for report in reports:
            if report.gpu_index is not None and (report.node.pk, report.gpu_index) not in found:
                raise ServiceError(
                    f"node {report.node.hostname} has no GPU {report.gpu_index}", field="gpu_index"
                )
    if nics:
        found = set(
            _NICS_OF.rows(nodes=sorted({n for n, _ in nics}), names=sorted({name for _, name in nics}))
        )
        for report in reports:
            if report.nic_name and (report.node.pk, report.nic_name) not in found:
                raise ServiceError(
                    f"node {report.node.hostname} has no NIC {report.nic_name}", field="nic_name"
                )


def _pending_key(cluster_id: int) -> str:
    return f"jobs:fault-handle-pending:{cluster_id}"


def _enqueue(fault_id: int, cluster_id: int | None = None) -> None:
    """Queue the handling of a cluster's new faults, unless one is already queued or running for that cluster: it
    takes this fault too, or, when the fault came after it gathered, queues the next handling as it ends (it looks
    for new faults once its decision is committed). So a cluster's faults reported while a decision runs are decided
    together by the next, as when every fault had a task of its own and half of them (at 50 faults/s) found their
    fault already taken; a storm's 512 reports queue a few tasks, not 512. The mark expires after
    FAULT_SWEEP_SECONDS (a lost message, a killed worker: the sweep queues regardless of it)."""
    from jobs.tasks import fault_handle_task

    if cluster_id is not None:
        try:
            if not cache.add(_pending_key(cluster_id), fault_id, timeout=settings.FAULT_SWEEP_SECONDS):
                return
        except (
            Exception
        ) as error:  # Redis away: queue anyway (the broker is likely away too; the sweep covers it)
            log.debug("fault-handle mark for cluster %s not set: %r", cluster_id, error)
        queue(fault_handle_task, fault_id, cluster_id)
        return
    queue(fault_handle_task, fault_id)  # the broker away: the fault is stored, and the fault sweep queues it


def _forget_pending(cluster_id: int) -> None:
    try:
        cache.delete(_pending_key(cluster_id))
    except Exception as error:  # Redis away: the mark expires by itself
        log.debug("fault-handle mark for cluster %s not cleared: %r", cluster_id, error)


def fault_handle(*, fault_id: int, cluster_id: int | None = None) -> list[int]:
    """Decide and start the recovery for the new faults of a fault's cluster (``cluster_id``, or the fault's), as one
    global decision. Idempotent: with no new fault left in the cluster it does nothing; returns the ids of actions
    created. Queued with ``cluster_id`` (by intake), it clears the cluster's mark when it ends, and queues the next
    handling if faults came meanwhile."""
    if cluster_id is None:
        cluster_id = FaultEvent.objects.filter(pk=fault_id).values_list("cluster_id", flat=True).first()
        if cluster_id is None:
            return []
        return _handle(cluster_id)[0]
    try:
        created, decided = _handle(cluster_id)
    finally:
        _forget_pending(cluster_id)
    if decided:
        # Committed: faults stored while it decided found the mark set and queued nothing; the next handling is theirs.
        waiting = _WAITING.first(cluster=cluster_id)
        if waiting is not None:
            _enqueue(waiting[0], cluster_id)
    return created


def _new_unlocked(cluster):
    from jobs.placement import _skip_locked

    return _skip_locked(
        FaultEvent.objects.filter(cluster_id=cluster, state=FaultState.NEW).order_by("received_at")
    )[:200]


_NEW_UNLOCKED = PreparedQuery(_new_unlocked, cluster=int)


def _handle(cluster_id: int) -> tuple[list[int], bool]:
    """One decision for a cluster's new faults: the ids of actions created, and whether it decided anything."""
    from jobs.placement import lock_cluster
    from jobs.services.recovery import decide

    with transaction.atomic():
        # Faults whose rows are locked are being decided right now (in another handler's batch): that handler settles
        # them, or rolls back and leaves them new for the sweep. Waiting for them would only queue up.
        faults = _NEW_UNLOCKED.rows(cluster=cluster_id)
        if not faults:
            return [], False
        cluster = lock_cluster(cluster_id)
        mode = cluster.effective_automation
        if mode == AutomationMode.PAUSED:
            reason = f"held: automation is paused (provider-wide, or on {cluster.name} or its fleet)"
            if faults[0].state_reason != reason:
                FaultEvent.objects.filter(pk=faults[0].pk).update(state_reason=reason)
            return [], False
        # Every event of the decision (its cordons, ladders and actions) is written at its end, in one statement.
        with events.gathered():
            return decide(cluster=cluster, faults=faults, dry_run=mode == AutomationMode.DRY_RUN), True


def fault_sweep(*, min_age_seconds: float | None = None) -> int:
    """Nudge the clusters that still have faults new after a few seconds (a message was lost, or a worker died);
    faults held by paused automation stay where they are. A decision takes every new fault of its cluster, so one
    task per cluster (for its oldest such fault) is enough: re-queueing every fault would, under a backlog, flood
    the queue with tasks that each find their fault already decided. Returns how many tasks were queued."""
    age = settings.FAULT_SWEEP_SECONDS if min_age_seconds is None else min_age_seconds
    cutoff = timezone.now() - timedelta(seconds=age)
    from django.db.models import Exists

    from fleet.models import AutomationSwitch

    rows = (
        FaultEvent.objects.filter(state=FaultState.NEW, received_at__lte=cutoff)
        .exclude(cluster__automation=AutomationMode.PAUSED)
        .exclude(cluster__fleet__automation=AutomationMode.PAUSED)
        .exclude(Exists(AutomationSwitch.objects.filter(mode=AutomationMode.PAUSED)))  # the provider switch
        .values("cluster_id")
        .annotate(oldest=Min("id"))
        .order_by("oldest")
        .values_list("oldest", flat=True)
    )
    ids = list(rows)
    for fault_id in ids:
        _enqueue(fault_id)  # whatever the mark says: this is what catches a lost message
    return len(ids)
