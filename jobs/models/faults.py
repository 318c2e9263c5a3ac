"""Fault events: stored before anything acts on them; reports of the same fault merge into one row."""

from django.db import models
from django.utils import timezone

from jobs.choices import FaultKind, FaultState, Severity


class FaultEvent(models.Model):
    """One fault on a node, GPU, NIC or rack, however many sources reported it.

    ``correlation_key`` (node, device, kind, code) joins reports within ``FAULT_CORRELATION_SECONDS``;
    ``idempotency_key`` joins API retries. ``triage`` records the catalogue's verdict (jobs.triage).
    """

    kind = models.CharField(max_length=20, choices=FaultKind.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.WARNING)
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="faults")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="faults")
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    nic_name = models.CharField(max_length=30, blank=True)
    rack = models.CharField(max_length=50, blank=True)
    sources = models.JSONField(default=list)
    report_count = models.PositiveIntegerField(default=1)
    detected_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    last_reported_at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=10, choices=FaultState.choices, default=FaultState.NEW)
    state_reason = models.CharField(max_length=300, blank=True)
    handled_at = models.DateTimeField(null=True, blank=True)
    triage = models.JSONField(default=dict, blank=True)
    needs_human = models.BooleanField(default=False)
    correlation_key = models.CharField(max_length=200)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    # A digest of the report the idempotency key came with: a retry carries the same, another report is refused.
    request_digest = models.CharField(max_length=64, null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    incident = models.ForeignKey(
        "jobs.Incident",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="faults",
        help_text="the failure this report is of",
    )

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["-detected_at", "-id"]
        indexes = [
            models.Index(fields=["correlation_key", "received_at"]),
            models.Index(fields=["state", "received_at"]),
            models.Index(fields=["cluster", "detected_at"]),
        ]

    def __str__(self):
        code = f" {self.xid}" if self.xid is not None else ""
        return f"{self.kind}{code} on {self.node_id}"

    @property
    def device(self) -> str:
        if self.gpu_index is not None:
            return f"gpu{self.gpu_index}"
        return self.nic_name or ""
