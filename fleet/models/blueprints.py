"""Blueprints: named bundles of add-ons and a fault-tolerance policy, published as immutable numbered versions."""

from django.conf import settings
from django.db import models

from fleet.choices import DriftMode, VersionState

# The add-ons that carry fault tolerance; a job is protected only when the policy turns them on *and* they
# are observed InSync and Healthy on its cluster (DESIGN).
PROTECTION_ADDONS = {"nic_failover": "nic-failover", "live_migration": "live-migration"}


class Blueprint(models.Model):
    name = models.SlugField(max_length=63, unique=True)
    description = models.TextField(blank=True)
    # When a version is activated: start a rollout with this strategy at once, or wait for an operator.
    auto_rollout = models.BooleanField(default=True)
    default_strategy = models.JSONField(default=dict, blank=True)
    drift_mode = models.CharField(max_length=10, choices=DriftMode.choices, default=DriftMode.NOTIFY)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class BlueprintVersion(models.Model):
    """One version: draft (editable) → active (immutable) → disabled (no new assignments)."""

    blueprint = models.ForeignKey(Blueprint, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=VersionState.choices, default=VersionState.DRAFT)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="children",
        help_text="a golden base version this one overrides",
    )
    # [{"name", "repo", "chart", "version", "namespace", "values": {}}]
    addons = models.JSONField(default=list, blank=True)
    # {"gpu_driver": "550.90.07", "cuda": "12.4", "nccl": "2.21.5", "nccl_net_plugin": "1.9", "nic_firmware": "28.39.1002"}
    node_software = models.JSONField(default=dict, blank=True)
    # {"protection": {"nic_failover": true, "live_migration": true}, "risk_threshold": 0.8, "disruption": {...}}
    policy = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["blueprint_id", "number"]
        constraints = [models.UniqueConstraint(fields=["blueprint", "number"], name="version_number_unique")]

    def __str__(self):
        return f"{self.blueprint.name} v{self.number}"

    @property
    def is_editable(self) -> bool:
        return self.state == VersionState.DRAFT

    def effective_addons(self) -> dict[str, dict]:
        """Add-ons by name: the parent's (recursively), overridden by this version's."""
        merged = self.parent.effective_addons() if self.parent_id else {}
        for addon in self.addons:
            merged[addon["name"]] = addon
        return merged

    def effective_node_software(self) -> dict:
        merged = self.parent.effective_node_software() if self.parent_id else {}
        merged.update(self.node_software)
        return merged

    def effective_policy(self) -> dict:
        merged = self.parent.effective_policy() if self.parent_id else {}
        merged.update(self.policy)
        return merged

    def protection_enabled(self) -> dict[str, bool]:
        protection = self.effective_policy().get("protection", {})
        return {key: bool(protection.get(key)) for key in PROTECTION_ADDONS}
