"""Values overlays: per-cluster and per-label values layered over a blueprint version's add-on values."""

from django.db import models

from fleet.models.blueprints import Blueprint


class ValuesOverlay(models.Model):
    """Values for one add-on of a blueprint, for one cluster or for the clusters carrying some labels.

    Precedence (docs/fleet.md, Overlays): the version's values, then each label overlay that matches, then each
    cluster overlay that names the cluster, each in ``position`` order; a later one wins key by key (mappings merge,
    anything else is replaced)."""

    blueprint = models.ForeignKey(Blueprint, on_delete=models.CASCADE, related_name="overlays")
    name = models.SlugField(max_length=63)
    position = models.PositiveIntegerField(default=0)
    cluster = models.ForeignKey(
        "fleet.Cluster", null=True, blank=True, on_delete=models.CASCADE, related_name="values_overlays"
    )
    labels = models.JSONField(default=dict, blank=True)
    addon = models.CharField(max_length=63)
    values = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["blueprint_id", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["blueprint", "name"], name="values_overlay_name_unique")
        ]

    def __str__(self):
        return f"{self.blueprint_id}/{self.name}"

    def matches(self, cluster) -> bool:
        if self.cluster_id is not None:
            return self.cluster_id == cluster.pk
        have = cluster.labels if isinstance(cluster.labels, dict) else {}
        return bool(self.labels) and all(have.get(key) == value for key, value in self.labels.items())
