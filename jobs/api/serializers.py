from rest_framework import serializers

from jobs.choices import FaultKind, FaultSource, Severity
from jobs.models import FaultEvent, Job, JobAllocation, JobSnapshot, RecoveryAction


class AllocationSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = JobAllocation
        fields = ["node", "hostname", "gpu_indices", "rank_start", "rank_end"]


class JobSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    iteration = serializers.SerializerMethodField()
    last_checkpoint_iteration = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    protected = serializers.SerializerMethodField()
    protection_reason = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "name", "tenant", "cluster", "cluster_name", "gpus", "simulated", "state", "iteration",
                  "seconds_per_iteration", "checkpoint_interval", "last_checkpoint_iteration", "total_iterations",
                  "slowdown", "degraded_until", "protected", "protection_reason", "allocations", "created_at",
                  "started_at", "ended_at"]

    def get_iteration(self, job) -> int:
        return job.iteration_now()

    def get_last_checkpoint_iteration(self, job) -> int:
        return job.checkpoint_iteration_now()

    def get_allocations(self, job) -> list[dict]:
        active = [a for a in job.allocations.all() if a.released_at is None]
        return AllocationSerializer(active, many=True).data

    def _protection(self, job):
        from jobs.services.common import protection_of

        cache = self.context.setdefault("protection", {})
        if job.cluster_id not in cache:
            cache[job.cluster_id] = protection_of(job.cluster)
        return cache[job.cluster_id]

    def get_protected(self, job) -> bool:
        return self._protection(job).protected

    def get_protection_reason(self, job) -> str:
        return self._protection(job).reason


class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    cluster = serializers.IntegerField(min_value=1)
    tenant = serializers.IntegerField(min_value=1, required=False, help_text="provider roles: the tenant it runs for")
    gpus = serializers.IntegerField(min_value=1, max_value=100_000)
    gpus_per_node = serializers.IntegerField(min_value=1, max_value=64, default=8)
    seconds_per_iteration = serializers.FloatField(min_value=0.001, max_value=86400, default=1.0)
    checkpoint_interval = serializers.IntegerField(min_value=1, max_value=10**9, default=1000)
    total_iterations = serializers.IntegerField(min_value=1, max_value=10**12, required=False)
    hostnames = serializers.ListField(child=serializers.CharField(max_length=100), required=False, max_length=4096,
                                      help_text="for a job on a real cluster: the hosts it runs on")
    gpu_model = serializers.CharField(max_length=30, required=False)


class ProgressSerializer(serializers.Serializer):
    iteration = serializers.IntegerField(min_value=0, max_value=2**62)
    step_seconds = serializers.FloatField(min_value=0.0001, max_value=86400, required=False)
    checkpoint = serializers.BooleanField(default=False)


class FaultSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = FaultEvent
        fields = ["id", "kind", "xid", "severity", "cluster", "node", "hostname", "gpu_index", "nic_name", "rack",
                  "sources", "report_count", "detected_at", "received_at", "last_reported_at", "state", "state_reason",
                  "handled_at", "triage", "needs_human", "details"]


class FaultReportSerializer(serializers.Serializer):
    node = serializers.IntegerField(min_value=1)
    kind = serializers.ChoiceField(choices=FaultKind.choices)
    source = serializers.ChoiceField(choices=FaultSource.choices, default=FaultSource.API)
    xid = serializers.IntegerField(min_value=0, max_value=100_000, required=False, allow_null=True)
    gpu_index = serializers.IntegerField(min_value=0, max_value=255, required=False, allow_null=True)
    nic_name = serializers.CharField(max_length=30, required=False, allow_blank=True)
    severity = serializers.ChoiceField(choices=Severity.choices, required=False, allow_blank=True)
    detected_at = serializers.DateTimeField(required=False)
    details = serializers.DictField(required=False)

    def validate(self, data):
        if data["kind"] == FaultKind.GPU_XID and data.get("xid") is None:
            raise serializers.ValidationError({"xid": ["a gpu_xid fault needs its code"]})
        return data


class RecoveryActionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RecoveryAction
        fields = ["id", "fault", "job", "cluster", "kind", "state", "dry_run", "node", "to_node", "gpu_index",
                  "to_gpu_index", "nic_name", "to_nic_name", "snapshot", "detected_at", "planned_at", "started_at",
                  "done_at", "ended_at", "gpus", "pause_seconds", "work_lost_seconds", "degraded_seconds", "slowdown",
                  "restore_iteration", "gpu_hours_lost", "gpu_hours_baseline", "gpu_hours_saved", "gpu_hours_at_stake",
                  "reason", "alternatives", "error"]


class SnapshotSerializer(serializers.ModelSerializer):
    seconds = serializers.FloatField(read_only=True, allow_null=True, help_text="how long it took; null while it runs")

    class Meta:
        model = JobSnapshot
        fields = ["id", "job", "state", "reason", "iteration", "started_at", "done_at", "ended_at", "seconds", "error"]
