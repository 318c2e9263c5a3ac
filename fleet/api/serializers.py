"""Shapes of fleet API input and output. Cluster credentials (``connection``) are write-only everywhere."""

from drf_spectacular.utils import PolymorphicProxySerializer
from rest_framework import serializers

from fleet.choices import DriftMode
from fleet.models import (
    GPU,
    NIC,
    Blueprint,
    BlueprintVersion,
    Cluster,
    DriftFinding,
    Fleet,
    Node,
    Rollout,
    RolloutBatch,
    RolloutCluster,
)


class RollupField(serializers.SerializerMethodField):
    def __init__(self, **kwargs):
        super().__init__(method_name="get_status", **kwargs)


class FleetSerializer(serializers.ModelSerializer):
    class Meta:
        model = Fleet
        fields = [
            "id",
            "name",
            "description",
            "automation",
            "max_cordoned_nodes",
            "max_draining_nodes",
            "max_disrupted_percent",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]
        extra_kwargs = {"name": {"validators": []}}


class VersionRefSerializer(serializers.ModelSerializer):
    blueprint = serializers.CharField(source="blueprint.name")

    class Meta:
        model = BlueprintVersion
        fields = ["blueprint", "number", "state"]


class ClusterSerializer(serializers.ModelSerializer):
    """A cluster in full; a tenant user gets only name, tier and blueprint version of a shared cluster."""

    blueprint_version = VersionRefSerializer(read_only=True)
    status = serializers.SerializerMethodField()
    connection = serializers.JSONField(write_only=True, required=False)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "name",
            "fleet",
            "dedicated_tenant",
            "region",
            "tier",
            "labels",
            "kind",
            "driver",
            "connection",
            "restart_overhead_minutes",
            "automation",
            "max_concurrent_migrations",
            "max_migrations_per_leaf",
            "blueprint_version",
            "track_latest",
            "pinned_reason",
            "status",
            "reachability",
            "reachability_changed_at",
            "last_observed_at",
            "observation_error",
            "created_at",
        ]
        read_only_fields = [
            "id",
            "blueprint_version",
            "track_latest",
            "pinned_reason",
            "status",
            "reachability",
            "reachability_changed_at",
            "last_observed_at",
            "observation_error",
            "created_at",
        ]
        extra_kwargs = {"name": {"validators": []}}

    def get_status(self, cluster) -> dict | None:
        rollup = self.context.get("statuses", {}).get(cluster.pk)
        if rollup is None:
            return None
        return {
            "sync": rollup.sync,
            "health": rollup.health,
            "ready": rollup.ready,
            "total": rollup.total,
            "messages": list(rollup.messages),
        }

    def to_representation(self, cluster):
        full = self.context.get("sees_in_full")
        if full is not None and not full(cluster):
            return ClusterOutlineSerializer(cluster).data
        return super().to_representation(cluster)


class ClusterOutlineSerializer(serializers.Serializer):
    """What a tenant user sees of a shared cluster: its name, tier and blueprint version, nothing more."""

    id = serializers.IntegerField(source="pk")
    name = serializers.CharField()
    tier = serializers.CharField()
    shared = serializers.SerializerMethodField()
    blueprint_version = VersionRefSerializer(allow_null=True)

    def get_shared(self, cluster) -> bool:
        return True


# A cluster in full, or the outline of a shared one (tenant users): the schema of what the cluster endpoints answer.
ClusterOrOutlineSerializer = PolymorphicProxySerializer(
    component_name="ClusterOrOutline",
    serializers=[ClusterSerializer, ClusterOutlineSerializer],
    resource_type_field_name=None,
)


class GPUSerializer(serializers.ModelSerializer):
    class Meta:
        model = GPU
        fields = ["index", "uuid", "model", "health", "health_reason"]


class NICSerializer(serializers.ModelSerializer):
    class Meta:
        model = NIC
        fields = ["name", "rail", "switch_port", "link_state"]


class NodeSerializer(serializers.ModelSerializer):
    gpus = GPUSerializer(many=True, read_only=True)
    nics = NICSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id",
            "cluster",
            "hostname",
            "rack",
            "leaf_switch",
            "spine_switch",
            "gpu_model",
            "state",
            "taints",
            "risk_score",
            "state_reason",
            "state_changed_at",
            "gpus",
            "nics",
        ]
        read_only_fields = fields


class NodeWriteSerializer(serializers.Serializer):
    taints = serializers.JSONField()


class NodeActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")


class BlueprintSerializer(serializers.ModelSerializer):
    latest_active = serializers.SerializerMethodField()

    class Meta:
        model = Blueprint
        fields = [
            "id",
            "name",
            "description",
            "auto_rollout",
            "default_strategy",
            "drift_mode",
            "latest_active",
            "created_at",
        ]
        read_only_fields = ["id", "latest_active", "created_at"]
        extra_kwargs = {"name": {"validators": []}}

    def get_latest_active(self, blueprint) -> int | None:
        numbers = [v.number for v in blueprint.versions.all() if v.state == "active"]
        return max(numbers) if numbers else None


class BlueprintWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    auto_rollout = serializers.BooleanField(required=False, default=True)
    default_strategy = serializers.JSONField(required=False, default=dict)
    drift_mode = serializers.ChoiceField(choices=DriftMode.choices, required=False, default=DriftMode.NOTIFY)


class VersionSerializer(serializers.ModelSerializer):
    parent = serializers.IntegerField(source="parent.number", read_only=True, default=None, allow_null=True)
    clusters = serializers.SerializerMethodField(help_text="how many clusters carry it")
    commit = serializers.SerializerMethodField(
        help_text="the git commit it was taken from (a blueprint source)"
    )

    class Meta:
        model = BlueprintVersion
        fields = [
            "number",
            "state",
            "parent",
            "addons",
            "node_software",
            "policy",
            "notes",
            "created_at",
            "activated_at",
            "disabled_at",
            "clusters",
            "commit",
        ]
        read_only_fields = fields

    def get_commit(self, version) -> dict | None:
        from django.core.exceptions import ObjectDoesNotExist

        try:
            commit = version.commit
        except ObjectDoesNotExist:
            return None
        return {"sha": commit.sha, "author": commit.author, "message": commit.message}

    def get_clusters(self, version) -> int:
        # Lists annotate the count (one query for all); a single version (created, patched, activated) counts.
        count = getattr(version, "cluster_count", None)
        return version.clusters.count() if count is None else count


class VersionWriteSerializer(serializers.Serializer):
    """Shapes only; the service validates add-ons, node software and policy and names the field at fault."""

    addons = serializers.JSONField(required=False)
    node_software = serializers.JSONField(required=False)
    policy = serializers.JSONField(required=False)
    notes = serializers.CharField(required=False, allow_blank=True, max_length=5000)
    parent = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    activate = serializers.BooleanField(required=False, default=False)


class AssignmentSerializer(serializers.Serializer):
    blueprint = serializers.IntegerField(min_value=1)
    version = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    track_latest = serializers.BooleanField(required=False, default=False)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=300, default="")


class RolloutBatchSerializer(serializers.ModelSerializer):
    counts = serializers.SerializerMethodField()

    class Meta:
        model = RolloutBatch
        fields = [
            "index",
            "canary",
            "status",
            "started_at",
            "soak_until",
            "finished_at",
            "faults_before",
            "faults_after",
            "gate",
            "counts",
        ]

    def get_counts(self, batch) -> dict:
        return self.context.get("counts", {}).get(batch.index, {})


class RolloutClusterSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="cluster.name", read_only=True)
    previous_version = serializers.IntegerField(
        source="previous_version.number", default=None, read_only=True
    )

    class Meta:
        model = RolloutCluster
        fields = [
            "cluster",
            "name",
            "batch_index",
            "status",
            "previous_version",
            "applied_at",
            "deadline_at",
            "healthy_at",
            "finished_at",
            "reason",
            "rolled_back_at",
        ]


class RolloutSerializer(serializers.ModelSerializer):
    blueprint = serializers.CharField(source="version.blueprint.name", read_only=True)
    # The number a rollout is started with and a version is addressed by (versions/{number}/), not a row id.
    version = serializers.IntegerField(
        source="version.number", read_only=True, help_text="the blueprint version's number (1, 2, 3…)"
    )

    class Meta:
        model = Rollout
        fields = [
            "id",
            "blueprint",
            "version",
            "state",
            "targets",
            "canary",
            "batch_size",
            "batch_percent",
            "max_failures",
            "progress_deadline_seconds",
            "soak_seconds",
            "change_window",
            "auto_rollback",
            "current_batch",
            "reason",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class RolloutDetailSerializer(RolloutSerializer):
    batches = RolloutBatchSerializer(many=True, read_only=True)
    clusters = RolloutClusterSerializer(many=True, read_only=True)

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "batches", "clusters"]
        read_only_fields = fields


class RolloutCreateSerializer(serializers.Serializer):
    blueprint = serializers.IntegerField(min_value=1)
    version = serializers.IntegerField(min_value=1, help_text="the version number within the blueprint")
    targets = serializers.JSONField(
        help_text='{"fleet": id} | {"labels": {...}} | {"clusters": [...]} | {"tracking": true}'
    )
    strategy = serializers.JSONField(required=False, default=dict)


class RolloutActionSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=300, default="")


class DriftFindingSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    # Declared: a read-only model field loses allow_blank, and the schema's enum then lacks the "" of an open finding.
    resolution = serializers.ChoiceField(
        choices=DriftFinding.Resolution.choices,
        allow_blank=True,
        read_only=True,
        help_text="empty while the finding is open",
    )

    class Meta:
        model = DriftFinding
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "addon",
            "kind",
            "diff",
            "detected_at",
            "last_seen_at",
            "resolved_at",
            "resolution",
            "correction_attempts",
            "last_correction_at",
            "last_correction_error",
            "gave_up_at",
        ]
        read_only_fields = fields
