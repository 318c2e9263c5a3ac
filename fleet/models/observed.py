"""Observed add-on state per cluster (what a driver last reported), and the simulated driver's own world."""

from django.db import models

from fleet.choices import HealthStatus, SyncStatus


class ObservedAddon(models.Model):
    """One add-on (or node-software component) on one cluster, as last observed, on Argo CD's two axes."""

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="observed_addons")
    name = models.CharField(max_length=63)
    chart = models.CharField(max_length=200, blank=True)
    version = models.CharField(max_length=64, blank=True)
    namespace = models.CharField(max_length=63, blank=True)
    values = models.JSONField(default=dict, blank=True)
    sync = models.CharField(max_length=12, choices=SyncStatus.choices, default=SyncStatus.UNKNOWN)
    health = models.CharField(max_length=12, choices=HealthStatus.choices, default=HealthStatus.UNKNOWN)
    # What the cluster's tooling said of an unhealthy add-on (Helm's description of a failed or stuck release).
    message = models.CharField(max_length=500, blank=True, default="", db_default="")
    # When this row's content last changed; the cluster's last_observed_at says when it was last seen at all.
    observed_at = models.DateTimeField()

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="observed_addon_unique")]

    def __str__(self):
        return f"{self.cluster_id}/{self.name}@{self.version} {self.sync}/{self.health}"


class SimulatedAddon(models.Model):
    """What is 'really' installed on a simulated cluster. Changed by the simulated driver and by drift injection."""

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="simulated_addons")
    name = models.CharField(max_length=63)
    chart = models.CharField(max_length=200, blank=True)
    version = models.CharField(max_length=64, blank=True)
    namespace = models.CharField(max_length=63, blank=True)
    values = models.JSONField(default=dict, blank=True)
    ready_at = models.DateTimeField(help_text="Progressing until then, Healthy after")
    failed = models.BooleanField(default=False, help_text="the release failed: Degraded")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="simulated_addon_unique")]

    def __str__(self):
        return f"{self.cluster_id}/{self.name}@{self.version}"


class SimulatedOperation(models.Model):
    """A long operation the simulated driver is carrying out (NIC failover, migration, snapshot…)."""

    cluster = models.ForeignKey(
        "fleet.Cluster", on_delete=models.CASCADE, related_name="simulated_operations"
    )
    operation = models.CharField(max_length=40)
    target = models.CharField(max_length=200)
    params = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    done_at = models.DateTimeField()
    fails = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["cluster", "done_at"])]

    def __str__(self):
        return f"{self.operation} {self.target}"
