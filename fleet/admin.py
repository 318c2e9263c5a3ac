"""Admin for the fleet (provider admin). Cluster credentials are never shown here either."""

from django.contrib import admin, messages

from controlplane.admin_readonly import ReadOnlyAdmin
from fleet.drivers import DriverError
from fleet.drivers.simulated import simulate_drift
from fleet.models import Blueprint, BlueprintVersion, Cluster, DriftFinding, Fleet, Rollout


@admin.register(Fleet)
class FleetAdmin(admin.ModelAdmin):
    list_display = ["name", "automation", "max_cordoned_nodes", "max_draining_nodes"]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "fleet",
        "driver",
        "tier",
        "blueprint_version",
        "track_latest",
        "last_observed_at",
    ]
    list_filter = ["fleet", "driver", "tier", "track_latest"]
    search_fields = ["name", "region"]
    exclude = ["connection"]  # credentials: set through the API by the provider admin, never shown back
    readonly_fields = ["blueprint", "blueprint_version", "track_latest", "pinned_reason", "last_observed_at"]
    actions = ["drift_version", "drift_values"]

    def _drift(self, request, queryset, kind: str):
        for cluster in queryset:
            try:
                done = simulate_drift(cluster, kind=kind)
            except DriverError as error:
                self.message_user(request, str(error), level=messages.WARNING)
            else:
                self.message_user(request, done)

    @admin.action(description="Simulate drift: bump an add-on's version out of band (simulated clusters)")
    def drift_version(self, request, queryset):
        self._drift(request, queryset, "version")

    @admin.action(description="Simulate drift: change an add-on's values out of band (simulated clusters)")
    def drift_values(self, request, queryset):
        self._drift(request, queryset, "values")


@admin.register(Blueprint)
class BlueprintAdmin(admin.ModelAdmin):
    list_display = ["name", "auto_rollout", "drift_mode"]


@admin.register(BlueprintVersion)
class BlueprintVersionAdmin(ReadOnlyAdmin):
    """Read-only: versions change through the services (drafts only), never by hand here; so do rollouts and
    drift findings (their services audit and publish)."""

    list_display = ["blueprint", "number", "state", "activated_at"]


@admin.register(Rollout)
class RolloutAdmin(ReadOnlyAdmin):
    list_display = ["id", "version", "state", "current_batch", "created_at"]


@admin.register(DriftFinding)
class DriftFindingAdmin(ReadOnlyAdmin):
    list_display = [
        "cluster",
        "addon",
        "kind",
        "detected_at",
        "resolved_at",
        "resolution",
        "correction_attempts",
    ]
    list_filter = ["kind", "resolution"]
