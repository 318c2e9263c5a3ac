"""Drift: observed add-on state that differs from the cluster's blueprint version."""

from django.db import models
from django.db.models import Q

from fleet.choices import DriftKind


class DriftFinding(models.Model):
    """One difference on one cluster, from the sweep that saw it until the sweep that no longer does."""

    class Resolution(models.TextChoices):
        CONVERGED = "converged", "Went away by itself"
        CORRECTED = "corrected", "Corrected by re-applying the desired state"

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="drift_findings")
    addon = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=DriftKind.choices)
    # [{"path": "values.replicas", "op": "changed", "desired": 2, "observed": 3}, ...]
    diff = models.JSONField(default=list, blank=True)
    detected_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=20, choices=Resolution.choices, blank=True)
    correction_attempts = models.PositiveIntegerField(default=0)
    last_correction_at = models.DateTimeField(null=True, blank=True)
    last_correction_error = models.CharField(max_length=300, blank=True)
    gave_up_at = models.DateTimeField(
        null=True, blank=True, help_text="corrections kept failing: reported, not retried"
    )

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["-detected_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "addon", "kind"],
                condition=Q(resolved_at__isnull=True),
                name="one_open_finding_per_cluster_addon_kind",
            ),
        ]
        indexes = [models.Index(fields=["cluster", "resolved_at"])]

    def __str__(self):
        return f"{self.cluster_id}/{self.addon} {self.kind}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None
