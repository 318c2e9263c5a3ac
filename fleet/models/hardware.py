"""Fleets, clusters and their hardware: nodes, GPUs, NICs on rails and leaf switches."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.prepared import PreparedQuery
from controlplane.security_crypto import EncryptedJSONField
from fleet.choices import (
    AutomationMode,
    ClusterKind,
    DriverName,
    GPUHealth,
    LinkState,
    NodeState,
    Reachability,
)
from tenancy.choices import TenantTier

# Published restart-from-checkpoint overheads run 5–20 minutes (data/failures/checkpoint_restart_figures.csv);
# the default takes the middle of that range. See docs/gpu-hours.md.
DEFAULT_RESTART_OVERHEAD_MINUTES = 10.0


AUTOMATION_ORDER = (AutomationMode.ACTIVE, AutomationMode.DRY_RUN, AutomationMode.PAUSED)


def strictest(*modes: str) -> str:
    """The strictest of these automation modes (paused over dry-run over active)."""
    return max(modes, key=AUTOMATION_ORDER.index, default=AutomationMode.ACTIVE)


class AutomationSwitch(models.Model):
    """The provider's one switch over all automation everywhere (a single row, pk 1): paused holds fault recovery,
    the escalation ladder, drift correction and rollout steps on every cluster; dry-run makes them decide and
    record only. Changed by the provider admin through ``/api/v1/automation/`` (audited)."""

    mode = models.CharField(max_length=10, choices=AutomationMode.choices, default=AutomationMode.ACTIVE)
    reason = models.CharField(max_length=300, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"provider automation: {self.mode}"


# Read by every decision: compiled once per process.
_PROVIDER_SWITCH = PreparedQuery(lambda: AutomationSwitch.objects.filter(pk=1).values_list("mode")[:1])


def provider_automation() -> str:
    """The provider switch's mode (active when it was never set)."""
    row = _PROVIDER_SWITCH.first()
    return (row[0] if row else None) or AutomationMode.ACTIVE


class Fleet(models.Model):
    """A named group of clusters run by the provider (a region, say)."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    automation = models.CharField(
        max_length=10, choices=AutomationMode.choices, default=AutomationMode.ACTIVE
    )
    # Fleet-wide caps on disruption: how many nodes may be cordoned or draining at once.
    max_cordoned_nodes = models.PositiveIntegerField(default=64)
    max_draining_nodes = models.PositiveIntegerField(default=16)
    # The circuit breaker: at most this share of the fleet's nodes cordoned or draining at once (at least one node
    # may always be); a cordon or drain over it is refused like one over the caps above, and waits.
    max_disrupted_percent = models.PositiveSmallIntegerField(
        default=20, db_default=20, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Cluster(models.Model):
    """A Kubernetes (or Slurm-on-Kubernetes) GPU cluster, reached through a driver."""

    fleet = models.ForeignKey(Fleet, on_delete=models.PROTECT, related_name="clusters")
    name = models.CharField(max_length=100, unique=True)
    dedicated_tenant = models.ForeignKey(
        "tenancy.Tenant", null=True, blank=True, on_delete=models.PROTECT, related_name="dedicated_clusters"
    )
    region = models.CharField(max_length=50, blank=True)
    # The tier of tenants a shared cluster serves; tenants see a shared cluster's name, tier and version only.
    tier = models.CharField(max_length=20, choices=TenantTier.choices, default=TenantTier.STANDARD)
    labels = models.JSONField(default=dict, blank=True)
    kind = models.CharField(max_length=30, choices=ClusterKind.choices, default=ClusterKind.KUBERNETES)
    driver = models.CharField(max_length=20, choices=DriverName.choices, default=DriverName.SIMULATED)
    # Connection settings and credentials for the driver: encrypted at rest (docs/security.md), never rendered in
    # pages or the API. Drivers read the plain dict.
    connection = EncryptedJSONField(default=dict, blank=True)
    restart_overhead_minutes = models.FloatField(
        default=DEFAULT_RESTART_OVERHEAD_MINUTES,
        validators=[MinValueValidator(0), MaxValueValidator(24 * 60)],
    )
    automation = models.CharField(
        max_length=10, choices=AutomationMode.choices, default=AutomationMode.ACTIVE
    )
    reachability = models.CharField(
        max_length=12,
        choices=Reachability.choices,
        default=Reachability.REACHABLE,
        db_default=Reachability.REACHABLE,
        help_text="whether Lockstep hears the cluster's nodes: unreachable when half of them went silent at once",
    )
    reachability_changed_at = models.DateTimeField(null=True, blank=True)
    max_concurrent_migrations = models.PositiveIntegerField(default=8)
    max_migrations_per_leaf = models.PositiveIntegerField(default=4)
    # Blueprint assignment: a pinned version, or track the latest active version of a blueprint.
    blueprint = models.ForeignKey(
        "fleet.Blueprint", null=True, blank=True, on_delete=models.PROTECT, related_name="clusters"
    )
    blueprint_version = models.ForeignKey(
        "fleet.BlueprintVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="clusters",
        help_text="the version the cluster should carry now",
    )
    track_latest = models.BooleanField(default=False)
    pinned_reason = models.CharField(max_length=300, blank=True)
    # When a driver last answered for the cluster's add-ons (the drift sweep, a rollout gate, a reconcile).
    last_observed_at = models.DateTimeField(null=True, blank=True)
    # Why the last observation got no answer (empty once one did): its add-ons are Unknown until the next one does.
    observation_error = models.CharField(max_length=300, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)

    tenant_scope = "dedicated_tenant_id"

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def effective_automation(self) -> str:
        """The strictest of the cluster's, its fleet's and the provider's automation mode (one query for the
        provider switch; a caller going over many clusters reads ``provider_automation()`` once and uses
        ``automation_under``)."""
        return self.automation_under(provider_automation())

    def automation_under(self, provider_mode: str) -> str:
        """The cluster's effective automation mode given the provider switch's mode."""
        return strictest(self.automation, self.fleet.automation, provider_mode)


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=100)
    rack = models.CharField(max_length=50, blank=True)
    leaf_switch = models.CharField(max_length=50, blank=True)
    spine_switch = models.CharField(max_length=50, blank=True)
    gpu_model = models.CharField(max_length=30)
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.READY)
    taints = models.JSONField(default=list, blank=True)
    # Written by telemetry's predictor; read by the planner (so jobs needs no telemetry import).
    risk_score = models.FloatField(default=0.0)
    risk_updated_at = models.DateTimeField(null=True, blank=True)
    # No job is migrated onto this node again before this time (anti-thrash).
    cooldown_until = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    state_reason = models.CharField(max_length=300, blank=True)

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["cluster_id", "hostname"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "hostname"], name="node_hostname_unique_per_cluster")
        ]
        indexes = [models.Index(fields=["cluster", "state"]), models.Index(fields=["cluster", "leaf_switch"])]

    def __str__(self):
        return self.hostname


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=30)
    health = models.CharField(max_length=10, choices=GPUHealth.choices, default=GPUHealth.HEALTHY)
    health_reason = models.CharField(max_length=300, blank=True)

    tenant_scope = "node__cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["node_id", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_per_node")]

    def __str__(self):
        return f"{self.node_id}/gpu{self.index}"


class NIC(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="nics")
    name = models.CharField(max_length=30)
    rail = models.PositiveSmallIntegerField()
    switch_port = models.CharField(max_length=60, blank=True)
    link_state = models.CharField(max_length=10, choices=LinkState.choices, default=LinkState.UP)

    tenant_scope = "node__cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["node_id", "rail", "name"]
        constraints = [models.UniqueConstraint(fields=["node", "name"], name="nic_name_unique_per_node")]

    def __str__(self):
        return f"{self.node_id}/{self.name}"
