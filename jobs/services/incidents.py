"""Incidents: every report of one failure folds into one Incident (rules in docs/incidents.md).

``incident_join`` runs inside fault intake, with the node's incident lock held, so two reports of one failure
arriving at once from two sources join one incident instead of opening two.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F

from jobs.choices import INCIDENT_SEVERITY, ActionState, FaultKind, IncidentScope, IncidentState
from jobs.models import FaultEvent, Incident, RecoveryAction

NIC_KINDS = frozenset({FaultKind.NIC_DOWN, FaultKind.LINK_FLAP, FaultKind.LINK_DEGRADED})


def severity_rank(kind: str, *, fatal: bool) -> int:
    """Where a report stands in INCIDENT_SEVERITY (0 is the most severe); a gpu_xid that takes the GPU out of
    service ranks as fatal."""
    name = "gpu_xid_fatal" if kind == FaultKind.GPU_XID and fatal else kind
    return INCIDENT_SEVERITY.index(name) if name in INCIDENT_SEVERITY else len(INCIDENT_SEVERITY)


def incident_rank(incident: Incident) -> int:
    return severity_rank(incident.kind, fatal=incident.fatal)


def _window() -> timedelta:
    return timedelta(seconds=settings.FAULT_CORRELATION_SECONDS)


def incident_is_open(incident: Incident, now: datetime) -> bool:
    """Open while a report is younger than the correlation window, or while a recovery of it is under way."""
    if incident.state != IncidentState.OPEN:
        return False
    if incident.last_reported_at >= now - _window():
        return True
    return RecoveryAction.objects.filter(incident=incident, dry_run=False,
                                         state__in=(ActionState.PLANNED, ActionState.RUNNING)).exists()


def incident_join(*, fault: FaultEvent, fatal: bool, now: datetime) -> Incident:
    """Open the node's incident for a new fault, or fold the fault into the one already open, escalating its kind
    and widening its scope as the rules say; sets ``fault.incident`` (the caller saves the fault). The caller
    holds the node's incident lock."""
    incident = (Incident.objects.select_for_update(of=("self",), no_key=True)
                .filter(node_id=fault.node_id, state=IncidentState.OPEN).order_by("-pk").first())
    if incident is not None and not incident_is_open(incident, now):
        incident_resolve(incident=incident, at=now)
        incident = None
    on_one_nic = fault.kind in NIC_KINDS and bool(fault.nic_name)
    if incident is None:
        incident = Incident.objects.create(
            cluster_id=fault.cluster_id, node_id=fault.node_id,
            scope=IncidentScope.NIC if on_one_nic else IncidentScope.NODE, nic_name=fault.nic_name if on_one_nic else "",
            kind=fault.kind, xid=fault.xid, fatal=fatal, opened_at=fault.detected_at, last_reported_at=now)
    else:
        if incident.scope == IncidentScope.NIC and not (on_one_nic and fault.nic_name == incident.nic_name):
            incident.scope, incident.nic_name = IncidentScope.NODE, ""   # several NICs, or the node itself
        if severity_rank(fault.kind, fatal=fatal) < incident_rank(incident):
            incident.kind, incident.xid, incident.fatal = fault.kind, fault.xid, fatal
        incident.report_count += 1
        incident.last_reported_at = now
        incident.opened_at = min(incident.opened_at, fault.detected_at)
        incident.save(update_fields=["scope", "nic_name", "kind", "xid", "fatal", "report_count", "last_reported_at",
                                     "opened_at"])
    fault.incident = incident
    return incident


def incident_report(*, incident_id: int | None, now: datetime) -> None:
    """Another report of a fault already stored (merged into it): its incident counts it and stays open."""
    if incident_id is not None:
        Incident.objects.filter(pk=incident_id).update(report_count=F("report_count") + 1, last_reported_at=now)


def incident_resolve(*, incident: Incident, at: datetime) -> None:
    incident.state, incident.resolved_at = IncidentState.RESOLVED, at
    incident.save(update_fields=["state", "resolved_at"])


def incidents_sweep(*, now: datetime) -> int:
    """Resolve the open incidents whose window has passed and whose recoveries have ended (beat). Returns how many."""
    stale = Incident.objects.filter(state=IncidentState.OPEN, last_reported_at__lt=now - _window())
    busy = RecoveryAction.objects.filter(dry_run=False, state__in=(ActionState.PLANNED, ActionState.RUNNING),
                                         incident__isnull=False).values("incident_id")
    return stale.exclude(pk__in=busy).update(state=IncidentState.RESOLVED, resolved_at=now)
