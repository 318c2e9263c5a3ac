"""Incidents: one underlying failure (a node dying, a link going grey) and every fault report of it."""

from django.db import models
from django.utils import timezone

from jobs.choices import FaultKind, IncidentScope, IncidentState


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
