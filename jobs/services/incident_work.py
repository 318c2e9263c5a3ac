"""Incidents as on-call work: acknowledge, assign, note, resolve with a cause, reopen.

Each is one transaction with the incident's row locked, audited, and published after commit to the fleet topic
(which the notifications read) and to the topics of the tenants that see the incident. Provider roles work
incidents; a tenant admin may add notes to the incidents its tenant sees; a tenant viewer only reads. The
fault path's ``state``/``resolved_at`` (reports still arriving, recoveries under way) is left alone: this is the
people's side of the same incident.
"""

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from controlplane import events
from controlplane.access import principal, require
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from jobs import selectors
from jobs.models import Incident
from jobs.models.incidents import IncidentCause, IncidentNote, IncidentWork

NOTE_MAX_CHARS = 10_000


def may_work(user) -> bool:
    """Acknowledge, assign, resolve and reopen: provider roles."""
    return principal(user).is_provider


def may_annotate(user) -> bool:
    """Add notes: provider roles, and a tenant admin (to the incidents its tenant sees)."""
    who = principal(user)
    return who.is_provider or (who.tenant_id is not None and who.may_submit_jobs(who.tenant_id))


def _locked(incident: Incident) -> Incident:
    return (
        Incident.objects.select_for_update(of=("self",), no_key=True)
        .select_related("cluster", "node")
        .get(pk=incident.pk)
    )


def _publish(
    incident: Incident, kind: str, summary: str, *, actor, tenant_ids: set[int] | None = None
) -> None:
    """One event on the fleet topic and on the topics of the tenants that see the incident (``tenant_ids``:
    only those, for a tenant's own note)."""
    tenants = selectors.incident_tenant_ids(incident) if tenant_ids is None else tenant_ids
    topics = [events.topic("fleet"), *(events.topic("tenant", t) for t in sorted(tenants))]
    payload = {
        "incident": incident.pk,
        "cluster": incident.cluster_id,
        "node": incident.node_id,
        "hostname": incident.node.hostname,
        "kind": incident.kind,
        "work_state": incident.work_state,
        "cause": incident.cause,
        "by": getattr(actor, "username", ""),
        "summary": summary,
    }
    events.publish(topics, kind, payload, url=reverse("incident-detail", args=[incident.pk]))


def _name(incident: Incident) -> str:
    return f"incident {incident.pk} ({incident.kind} on {incident.node.hostname})"


def _refuse_resolved(incident: Incident, doing: str) -> None:
    if incident.work_state == IncidentWork.RESOLVED:
        raise ServiceError(f"{_name(incident)} is resolved: reopen it before you {doing} it", status=409)


@transaction.atomic
def incident_acknowledge(*, actor, incident: Incident) -> Incident:
    """A person has it: its time to acknowledge stops."""
    require(may_work(actor), "only provider roles acknowledge incidents")
    incident = _locked(incident)
    _refuse_resolved(incident, "acknowledge")
    if incident.acknowledged_at is not None:
        raise ServiceError(f"{_name(incident)} is already acknowledged", status=409)
    incident.work_state, incident.acknowledged_at, incident.acknowledged_by = (
        IncidentWork.ACKNOWLEDGED,
        timezone.now(),
        actor,
    )
    incident.save(update_fields=["work_state", "acknowledged_at", "acknowledged_by"])
    audit_record(
        actor=actor, action="incident.acknowledge", target=incident, changes={"work_state": "acknowledged"}
    )
    _publish(
        incident, "incident.acknowledged", f"{_name(incident)} acknowledged by {actor.username}", actor=actor
    )
    return incident


@transaction.atomic
def incident_assign(*, actor, incident: Incident, assignee) -> Incident:
    """Give it to a user who may see it (``assignee`` None: to nobody)."""
    require(may_work(actor), "only provider roles assign incidents")
    incident = _locked(incident)
    _refuse_resolved(incident, "assign")
    if (
        assignee is not None
        and not selectors.incident_assignees(incident=incident).filter(pk=assignee.pk).exists()
    ):
        raise ServiceError("no active user who may see this incident has that id", field="user")
    old = incident.assignee.username if incident.assignee_id else None
    incident.assignee = assignee
    incident.save(update_fields=["assignee"])
    new = assignee.username if assignee is not None else None
    audit_record(actor=actor, action="incident.assign", target=incident, changes={"assignee": [old, new]})
    summary = f"{_name(incident)} assigned to {new}" if new else f"{_name(incident)} unassigned"
    _publish(incident, "incident.assigned", summary, actor=actor)
    return incident


@transaction.atomic
def incident_note(*, actor, incident: Incident, body: str) -> IncidentNote:
    """A note in Markdown (shown with raw HTML off). A tenant user's note is its tenant's and the provider's."""
    require(may_annotate(actor), "you may not add notes to incidents")
    body = (body or "").strip()
    if not body:
        raise ServiceError("write the note", field="body")
    if len(body) > NOTE_MAX_CHARS:
        raise ServiceError(f"a note holds at most {NOTE_MAX_CHARS} characters", field="body")
    incident = _locked(incident)
    tenant_id = principal(actor).tenant_id
    note = IncidentNote.objects.create(incident=incident, author=actor, tenant_id=tenant_id, body=body)
    audit_record(
        actor=actor,
        action="incident.note",
        target=incident,
        tenant_id=tenant_id,
        changes={"note": note.pk, "chars": len(body)},
    )
    _publish(
        incident,
        "incident.noted",
        f"{actor.username} added a note to {_name(incident)}",
        actor=actor,
        tenant_ids={tenant_id} if tenant_id else None,
    )
    return note


@transaction.atomic
def incident_resolve(*, actor, incident: Incident, cause: str) -> Incident:
    """A person closes it with a cause (resolving acknowledges it too, if no one had). Refused while a recovery
    of it still runs: its jobs are not back yet."""
    require(may_work(actor), "only provider roles resolve incidents")
    if cause not in IncidentCause.values:
        raise ServiceError(f"the cause is one of {', '.join(IncidentCause.values)}", field="cause")
    incident = _locked(incident)
    if incident.work_state == IncidentWork.RESOLVED:
        raise ServiceError(
            f"{_name(incident)} is already resolved (cause: {incident.get_cause_display().lower()})",
            status=409,
        )
    if selectors.incident_recovering(incident=incident):
        raise ServiceError(
            f"a recovery of {_name(incident)} is still running: resolve it once it ends", status=409
        )
    now = timezone.now()
    incident.work_state, incident.closed_at, incident.closed_by, incident.cause = (
        IncidentWork.RESOLVED,
        now,
        actor,
        cause,
    )
    fields = ["work_state", "closed_at", "closed_by", "cause"]
    if incident.acknowledged_at is None:
        incident.acknowledged_at, incident.acknowledged_by = now, actor
        fields += ["acknowledged_at", "acknowledged_by"]
    incident.save(update_fields=fields)
    audit_record(
        actor=actor,
        action="incident.resolve",
        target=incident,
        changes={"work_state": "resolved", "cause": cause},
    )
    summary = f"{_name(incident)} resolved by {actor.username}: {incident.get_cause_display().lower()}"
    _publish(incident, "incident.resolved", summary, actor=actor)
    return incident


@transaction.atomic
def incident_reopen(*, actor, incident: Incident) -> Incident:
    """Back to work: its resolution and cause are cleared (its acknowledgement stays)."""
    require(may_work(actor), "only provider roles reopen incidents")
    incident = _locked(incident)
    if incident.work_state != IncidentWork.RESOLVED:
        raise ServiceError(f"{_name(incident)} is not resolved", status=409)
    old_cause = incident.cause
    incident.work_state = IncidentWork.ACKNOWLEDGED if incident.acknowledged_at else IncidentWork.NEW
    incident.closed_at, incident.closed_by, incident.cause = None, None, ""
    incident.save(update_fields=["work_state", "closed_at", "closed_by", "cause"])
    audit_record(
        actor=actor,
        action="incident.reopen",
        target=incident,
        changes={"work_state": ["resolved", incident.work_state], "cause": [old_cause, ""]},
    )
    _publish(incident, "incident.reopened", f"{_name(incident)} reopened by {actor.username}", actor=actor)
    return incident
