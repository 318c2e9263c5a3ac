"""Incidents: one underlying failure (a node dying, a link going grey) and every fault report of it."""

from django.conf import settings
from django.db import models
from django.utils import timezone

from jobs.choices import FaultKind, IncidentScope, IncidentState


class IncidentWork(models.TextChoices):
    """Where the on-call work on an incident stands (its ``state`` is the fault path's: reports still arriving)."""

    NEW = "new", "New, not acknowledged"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved by a person"


class IncidentCause(models.TextChoices):
    """What a person found the cause to be when resolving it."""

    HARDWARE = "hardware", "Hardware (GPU, memory, board)"
    FABRIC = "fabric", "Fabric (NIC, link, switch)"
    SOFTWARE = "software", "Software (driver, firmware, job)"
    FACILITY = "facility", "Facility (power, cooling)"
    UNKNOWN = "unknown", "Unknown"


class Incident(models.Model):
    """Every report of one failure, across kinds and sources (rules in docs/incidents.md).

    A node has at most one open incident: node-level reports open or join it, and so do NIC reports, which keep
    it ``nic``-scoped while they all name one NIC. ``kind`` is the most severe report's (``INCIDENT_SEVERITY``).
    It stays open while a report is younger than ``FAULT_CORRELATION_SECONDS`` or a recovery of it runs.
    """

    # Their lookups use the (cluster, opened_at) and (node, state) indexes: no index of their own (fewer to write).
    cluster = models.ForeignKey(
        "fleet.Cluster", on_delete=models.CASCADE, related_name="incidents", db_index=False
    )
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="incidents", db_index=False)
    scope = models.CharField(max_length=4, choices=IncidentScope.choices, default=IncidentScope.NODE)
    nic_name = models.CharField(max_length=30, blank=True, help_text="the one NIC of a nic-scoped incident")
    kind = models.CharField(max_length=20, choices=FaultKind.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    fatal = models.BooleanField(default=False, help_text="its kind took a GPU or the node out of service")
    rank = models.PositiveSmallIntegerField(
        default=0, help_text="its kind's place in INCIDENT_SEVERITY (0: most severe)"
    )
    state = models.CharField(max_length=10, choices=IncidentState.choices, default=IncidentState.OPEN)
    opened_at = models.DateTimeField(default=timezone.now, help_text="when its first report was detected")
    last_reported_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    report_count = models.PositiveIntegerField(
        default=1, help_text="reports of all its faults, merged ones too"
    )
    # The on-call work (jobs.services.incident_work): acknowledged, assigned, noted, resolved with a cause by a
    # person. ``resolved_at`` above is the fault path's (reports stopped, recoveries ended): its time to recover.
    # Defaults in the database too: fault intake inserts incidents in SQL of its own (jobs.services.incidents).
    work_state = models.CharField(
        max_length=12, choices=IncidentWork.choices, default=IncidentWork.NEW, db_default=IncidentWork.NEW
    )
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="assigned_incidents",
    )
    closed_at = models.DateTimeField(
        null=True, blank=True, help_text="when a person resolved it, with a cause"
    )
    closed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cause = models.CharField(
        max_length=10, choices=IncidentCause.choices, blank=True, default="", db_default=""
    )

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [
            models.Index(fields=["node", "state"]),
            models.Index(fields=["cluster", "opened_at"]),
            models.Index(fields=["state", "last_reported_at"]),
        ]

    def __str__(self):
        where = f"{self.node_id}/{self.nic_name}" if self.scope == IncidentScope.NIC else str(self.node_id)
        return f"incident {self.pk}: {self.kind} on {where} ({self.state})"


class IncidentNote(models.Model):
    """A note on an incident, in Markdown (rendered with raw HTML off). A tenant user's note is seen by that tenant
    and the provider; a provider user's by everyone who sees the incident."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="notes")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tenant = models.ForeignKey(
        "tenancy.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="the author's tenant (empty: a provider user's note)",
    )
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    tenant_scope = "tenant_id"

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["incident", "created_at"])]

    def __str__(self):
        return f"note {self.pk} on incident {self.incident_id}"
