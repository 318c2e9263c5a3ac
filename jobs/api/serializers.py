from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs import figures, selectors
from jobs.choices import INTERNAL_FAULT_KINDS, FaultKind, FaultSource, Severity, SnapshotKind
from jobs.models import FaultEvent, Incident, Job, JobAllocation, JobSnapshot, RecoveryAction
from jobs.models.incidents import IncidentCause, IncidentNote


class AllocationSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)

    class Meta:
        model = JobAllocation
        fields = ["node", "hostname", "gpu_indices", "rank_start", "rank_end"]


class JobSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    simulated = serializers.SerializerMethodField(help_text="the job runs on a simulated cluster")
    reports_progress = serializers.SerializerMethodField(
        help_text="the job reports its own progress (otherwise Lockstep advances it by the clock)"
    )
    iteration = serializers.SerializerMethodField()
    last_checkpoint_iteration = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    protected = serializers.SerializerMethodField()
    protection_reason = serializers.SerializerMethodField()
    restart_baseline = serializers.SerializerMethodField(
        help_text="the restart overhead a fault of this job is priced against now: seconds, basis (measured on "
        "this cluster for jobs of its size, or assumed: the cluster's setting), samples, needed, detail"
    )
    standbys = serializers.SerializerMethodField(
        help_text="the job's live standbys (nodes of its own allocation, from its runtime's reports)"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "tenant",
            "cluster",
            "cluster_name",
            "gpus",
            "simulated",
            "reports_progress",
            "state",
            "state_reason",
            "iteration",
            "seconds_per_iteration",
            "checkpoint_interval",
            "last_checkpoint_iteration",
            "total_iterations",
            "slowdown",
            "degraded_until",
            "protected",
            "protection_reason",
            "restart_baseline",
            "standbys",
            "allocations",
            "created_at",
            "started_at",
            "ended_at",
        ]

    def get_iteration(self, job) -> int:
        return job.iteration_now()

    def get_simulated(self, job) -> bool:
        from fleet.choices import DriverName

        return job.cluster.driver == DriverName.SIMULATED

    def get_reports_progress(self, job) -> bool:
        return job.reports_progress

    def get_last_checkpoint_iteration(self, job) -> int:
        return job.checkpoint_iteration_now()

    def get_allocations(self, job) -> list[dict]:
        active = [a for a in job.allocations.all() if a.released_at is None]
        return AllocationSerializer(active, many=True).data

    def _protection(self, job):
        from jobs.protection import job_protection, runtime_policy_on
        from jobs.services.capabilities import protection_of

        cache = self.context.setdefault("protection", {})
        if job.simulated:
            if job.cluster_id not in cache:
                cache[job.cluster_id] = protection_of(job.cluster)
            return cache[job.cluster_id]
        # A real job: its cluster's policy (once per cluster) and its own runtime's reports.
        policy = ("runtime-policy", job.cluster_id)
        if policy not in cache:
            cache[policy] = runtime_policy_on(job.cluster)
        if ("job", job.pk) not in cache:
            cache[("job", job.pk)] = job_protection(job, policy=cache[policy])
        return cache[("job", job.pk)]

    def get_protected(self, job) -> bool:
        return self._protection(job).protected

    def get_protection_reason(self, job) -> str:
        return self._protection(job).reason

    @extend_schema_field(serializers.DictField())
    def get_restart_baseline(self, job) -> dict:
        from jobs.services.estimates import restart_baseline_of, restart_baselines_of

        cache = self.context.setdefault("restart-baselines", {})
        if job.cluster_id not in cache:
            cache[job.cluster_id] = restart_baselines_of(job.cluster)
        return restart_baseline_of(job, measured=cache[job.cluster_id]).as_dict()

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_standbys(self, job) -> list[dict]:
        return [
            {"node": s.node_id, "hostname": s.node.hostname, "since": s.since}
            for s in job.standbys.all()
            if s.released_at is None
        ]


class JobSubmitSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    cluster = serializers.IntegerField(min_value=1)
    tenant = serializers.IntegerField(
        min_value=1, required=False, help_text="provider roles: the tenant it runs for"
    )
    gpus = serializers.IntegerField(min_value=1, max_value=100_000)
    gpus_per_node = serializers.IntegerField(min_value=1, max_value=64, default=8)
    seconds_per_iteration = serializers.FloatField(min_value=0.001, max_value=86400, default=1.0)
    checkpoint_interval = serializers.IntegerField(min_value=1, max_value=10**9, default=1000)
    total_iterations = serializers.IntegerField(min_value=1, max_value=10**12, required=False)
    hostnames = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=4096,
        help_text="for a job on a real cluster: the hosts it runs on",
    )
    gpu_model = serializers.CharField(max_length=30, required=False)


class ProgressSerializer(serializers.Serializer):
    iteration = serializers.IntegerField(min_value=0, max_value=2**62)
    step_seconds = serializers.FloatField(min_value=0.0001, max_value=86400, required=False)
    checkpoint = serializers.BooleanField(default=False)


class FaultSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    incident = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="the failure this report is of"
    )

    class Meta:
        model = FaultEvent
        fields = [
            "id",
            "kind",
            "xid",
            "severity",
            "cluster",
            "node",
            "hostname",
            "gpu_index",
            "nic_name",
            "rack",
            "sources",
            "report_count",
            "detected_at",
            "received_at",
            "last_reported_at",
            "state",
            "state_reason",
            "handled_at",
            "triage",
            "needs_human",
            "details",
            "incident",
        ]


@extend_schema_field(
    {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 1, "maxLength": 100}]}
)
class IdOrNameField(serializers.Field):
    """A row named by its id (an integer, or a string of digits) or by its name (any other string)."""

    default_error_messages = {"invalid": "an id (a whole number) or a name (1 to 100 characters)"}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, str)):
            self.fail("invalid")
        if isinstance(data, int):
            if data < 1 or data > 2**63 - 1:
                self.fail("invalid")
            return data
        text = data.strip()
        if not text or len(text) > 100 or "\x00" in text:
            self.fail("invalid")
        if text.isascii() and text.isdigit():
            return self.to_internal_value(int(text))
        return text

    def to_representation(self, value):
        return value


class FaultReportSerializer(serializers.Serializer):
    node = IdOrNameField(required=False, help_text="the node: its id, or its hostname")
    hostname = serializers.CharField(
        max_length=100, required=False, help_text="the node's hostname (instead of node)"
    )
    cluster = IdOrNameField(
        required=False,
        help_text="the node's cluster, id or name: needed only when the hostname is on several clusters",
    )
    kind = serializers.ChoiceField(choices=FaultKind.choices)
    source = serializers.ChoiceField(choices=FaultSource.choices, default=FaultSource.API)
    xid = serializers.IntegerField(min_value=0, max_value=100_000, required=False, allow_null=True)
    gpu_index = serializers.IntegerField(min_value=0, max_value=255, required=False, allow_null=True)
    nic_name = serializers.CharField(max_length=30, required=False, allow_blank=True)
    severity = serializers.ChoiceField(choices=Severity.choices, required=False, allow_blank=True)
    detected_at = serializers.DateTimeField(required=False)
    details = serializers.DictField(required=False)

    def validate(self, data):
        if "node" in data and "hostname" in data:
            raise serializers.ValidationError(
                {"hostname": ["name the node once: node or hostname, not both"]}
            )
        if "node" not in data and "hostname" not in data:
            raise serializers.ValidationError({"node": ["name the node: its id or hostname"]})
        if data["kind"] == FaultKind.GPU_XID and data.get("xid") is None:
            raise serializers.ValidationError({"xid": ["a gpu_xid fault needs its code"]})
        if data["kind"] in INTERNAL_FAULT_KINDS or data.get("source") == FaultSource.LOCKSTEP:
            # A drain request moves every job off its node: Lockstep raises it when the node is drained.
            field = "kind" if data["kind"] in INTERNAL_FAULT_KINDS else "source"
            raise serializers.ValidationError(
                {
                    field: [
                        "only Lockstep raises this: drain the node instead (POST /api/v1/nodes/{id}/drain/)"
                    ]
                }
            )
        return data


class RecoveryActionSerializer(serializers.ModelSerializer):
    incident = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="the failure this action answers"
    )
    previous = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True, help_text="the attempt this one replaced"
    )
    restart_baseline = serializers.SerializerMethodField(
        help_text="the restart overhead its baseline was priced with: seconds, basis (measured on this cluster "
        "for jobs of this size, or assumed: the cluster's setting), samples, needed, detail"
    )
    expected = serializers.SerializerMethodField(
        help_text="what it was expected to cost when chosen; the ledger fields are what happened"
    )

    def get_restart_baseline(self, action) -> dict | None:
        return (action.estimate or {}).get("restart_overhead")

    def get_expected(self, action) -> dict | None:
        return (action.estimate or {}).get("expected")

    class Meta:
        model = RecoveryAction
        fields = [
            "id",
            "fault",
            "incident",
            "job",
            "cluster",
            "kind",
            "state",
            "dry_run",
            "attempt",
            "previous",
            "node",
            "to_node",
            "gpu_index",
            "to_gpu_index",
            "nic_name",
            "to_nic_name",
            "snapshot",
            "detected_at",
            "planned_at",
            "started_at",
            "done_at",
            "deadline_at",
            "ended_at",
            "gpus",
            "pause_seconds",
            "work_lost_seconds",
            "degraded_seconds",
            "slowdown",
            "snapshot_overhead_seconds",
            "restore_iteration",
            "gpu_hours_lost",
            "gpu_hours_baseline",
            "gpu_hours_saved",
            "saving",
            "gpu_hours_expected",
            "gpu_hours_at_stake",
            "reason",
            "alternatives",
            "estimate",
            "restart_baseline",
            "expected",
            "failed_back_at",
            "resumed_at",
            "error",
        ]


class IncidentSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="node.hostname", read_only=True)
    fault_count = serializers.SerializerMethodField(help_text="fault events grouped into it")
    sources = serializers.SerializerMethodField(help_text="every source that reported it")
    url = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "cluster",
            "node",
            "hostname",
            "scope",
            "nic_name",
            "kind",
            "xid",
            "state",
            "opened_at",
            "last_reported_at",
            "resolved_at",
            "report_count",
            "fault_count",
            "sources",
            "url",
        ]
        read_only_fields = fields

    def get_fault_count(self, incident) -> int:
        return len(incident.faults.all())

    def get_sources(self, incident) -> list[str]:
        return selectors.sources_of(incident)

    def get_url(self, incident) -> str:
        return reverse("api:incident-detail", args=[incident.pk])


class IncidentFaultSerializer(serializers.ModelSerializer):
    class Meta:
        model = FaultEvent
        fields = [
            "id",
            "kind",
            "xid",
            "gpu_index",
            "nic_name",
            "sources",
            "report_count",
            "detected_at",
            "state",
            "state_reason",
        ]
        read_only_fields = fields


class IncidentActionSerializer(serializers.ModelSerializer):
    class Meta:
        model = RecoveryAction
        fields = [
            "id",
            "kind",
            "state",
            "job",
            "attempt",
            "previous",
            "to_node",
            "error",
            "gpu_hours_baseline",
            "gpu_hours_lost",
            "gpu_hours_saved",
            "saving",
            "gpu_hours_expected",
            "restart_baseline",
            "expected",
            "ended_at",
        ]
        read_only_fields = fields

    restart_baseline = serializers.SerializerMethodField(
        help_text="the restart overhead its baseline was priced with: measured or assumed"
    )
    expected = serializers.SerializerMethodField(
        help_text="what it was expected to cost when chosen (the ledger fields are what happened)"
    )

    def get_restart_baseline(self, action) -> dict | None:
        return (action.estimate or {}).get("restart_overhead")

    def get_expected(self, action) -> dict | None:
        return (action.estimate or {}).get("expected")


class IncidentLedgerSerializer(serializers.Serializer):
    """An incident's line in the GPU-hours ledger: totals over its actions (docs/gpu-hours.md)."""

    gpu_hours_baseline = serializers.FloatField()
    gpu_hours_lost = serializers.FloatField()
    gpu_hours_saved = serializers.FloatField(help_text="realized savings only")
    gpu_hours_expected = serializers.FloatField(help_text="savings of proactive moves not settled yet")
    jobs = serializers.IntegerField(help_text="distinct jobs it hit")
    restart_baselines = serializers.ListField(
        child=serializers.DictField(),
        help_text="the restart overhead(s) its baselines were priced with: seconds, basis (measured or assumed), "
        "detail",
    )


class IncidentDetailSerializer(IncidentSerializer):
    faults = IncidentFaultSerializer(many=True, read_only=True)
    actions = IncidentActionSerializer(many=True, read_only=True)
    ledger = serializers.SerializerMethodField()

    class Meta(IncidentSerializer.Meta):
        fields = [*IncidentSerializer.Meta.fields, "faults", "actions", "ledger"]
        read_only_fields = fields

    @extend_schema_field(IncidentLedgerSerializer)
    def get_ledger(self, incident) -> dict:
        from jobs.ledger import restart_bases

        actions = incident.actions.all()
        booked = [a for a in actions if a.state == "succeeded" and not a.dry_run and a.job_id is not None]
        return {**figures.incident_ledger(actions), "restart_baselines": restart_bases(booked)}


class SnapshotSerializer(serializers.ModelSerializer):
    seconds = serializers.FloatField(
        read_only=True, allow_null=True, help_text="how long it took; null while it runs"
    )

    class Meta:
        model = JobSnapshot
        fields = [
            "id",
            "job",
            "kind",
            "state",
            "reason",
            "iteration",
            "started_at",
            "done_at",
            "ended_at",
            "seconds",
            "error",
            "size_bytes",
            "locations",
            "stalled_ranks",
            "note",
            "overhead_seconds",
            "details",
        ]


class SnapshotLocationSerializer(serializers.Serializer):
    """Where one rank's copies live, as the runtime names them: ``{"rank": 1, "own": "node1", "replica": "node2"}``,
    or after a restore ``{"rank": 1, "source": "replica on node2"}``."""

    rank = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    ranks = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    own = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=True)
    replica = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=True)
    source = serializers.CharField(max_length=200, required=False, allow_blank=True)
    node = serializers.CharField(max_length=200, required=False, allow_blank=True)
    disk = serializers.CharField(max_length=500, required=False, allow_blank=True)

    def to_internal_value(self, data):
        unknown = set(data) - set(self.fields) if isinstance(data, dict) else set()
        if unknown:
            raise serializers.ValidationError(f"unknown keys: {', '.join(sorted(map(str, unknown)))}")
        return super().to_internal_value(data)


def _hosts() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=100, allow_blank=False), required=False, max_length=4096
    )


# What a runtime report may carry beside its restore point, kept with it (``JobSnapshot.details``).
RUNTIME_DETAILS = (
    "at",
    "fault_at",
    "lost_ranks",
    "lost_nodes",
    "from_nodes",
    "to_nodes",
    "standbys",
    "standbys_left",
    "active_nodes",
    "detail",
    "reason",
    "generation",
    "lost_iterations",
    "reached",
    "survivor_pids",
)


class SnapshotReportSerializer(serializers.Serializer):
    """A report of the job's protection runtime (``lockstep_agent.protect``), sent with the job token."""

    kind = serializers.ChoiceField(choices=[c for c in SnapshotKind.choices if c[0] != SnapshotKind.PLATFORM])
    iteration = serializers.IntegerField(min_value=0, max_value=2**62)
    seconds = serializers.FloatField(
        min_value=0,
        max_value=30 * 86400,
        required=False,
        allow_null=True,
        help_text="measured: capture + replication, restore, or how long a rank hangs",
    )
    bytes = serializers.IntegerField(min_value=0, max_value=2**62, required=False, allow_null=True)
    overhead_seconds = serializers.FloatField(
        min_value=0,
        max_value=30 * 86400,
        required=False,
        allow_null=True,
        help_text="training time its snapshots cost since its previous report (in the training thread)",
    )
    locations = SnapshotLocationSerializer(many=True, required=False, max_length=1024)
    stalled_ranks = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=10_000_000), required=False, max_length=4096
    )
    note = serializers.CharField(max_length=300, required=False, allow_blank=True)
    # In-job recovery (issue 49): a lost peer, a rank replaced by a standby, the job's standbys.
    at = serializers.FloatField(
        min_value=0, max_value=2**34, required=False, help_text="epoch seconds: noticed, or first step after"
    )
    fault_at = serializers.FloatField(min_value=0, max_value=2**34, required=False)
    lost_ranks = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=10_000_000), required=False, max_length=4096
    )
    lost_nodes = _hosts()
    from_nodes = _hosts()
    to_nodes = _hosts()
    standbys = _hosts()
    standbys_left = _hosts()
    active_nodes = _hosts()
    detail = serializers.CharField(max_length=2000, required=False, allow_blank=True, trim_whitespace=False)
    reason = serializers.CharField(
        max_length=300, required=False, allow_blank=True, help_text="a fallback: which, and why"
    )
    generation = serializers.IntegerField(min_value=0, max_value=2**31, required=False)
    lost_iterations = serializers.IntegerField(min_value=0, max_value=2**62, required=False)
    reached = serializers.IntegerField(min_value=0, max_value=2**62, required=False)
    survivor_pids = serializers.DictField(
        child=serializers.IntegerField(min_value=0, max_value=2**31), required=False
    )

    def validate_survivor_pids(self, value):
        if len(value) > 4096 or not all(str(key).isdigit() for key in value):
            raise serializers.ValidationError("rank numbers to process ids, at most 4096")
        return value

    def validate(self, attrs):
        kind = attrs["kind"]
        if attrs.get("stalled_ranks") and kind != SnapshotKind.HANG:
            raise serializers.ValidationError({"stalled_ranks": ["only a hang names stalled ranks"]})
        if kind == SnapshotKind.PEER_LOST and not (attrs.get("lost_nodes") or attrs.get("lost_ranks")):
            raise serializers.ValidationError({"lost_nodes": ["a lost peer names its node or rank"]})
        if kind == SnapshotKind.RANK_REPLACED:
            missing = [name for name in ("at", "lost_ranks", "to_nodes") if not attrs.get(name)]
            if missing:
                raise serializers.ValidationError({name: ["a replaced rank says this"] for name in missing})
        for name in ("lost_ranks", "lost_nodes", "from_nodes", "to_nodes", "lost_iterations", "reached"):
            if name in attrs and kind not in (SnapshotKind.PEER_LOST, SnapshotKind.RANK_REPLACED):
                raise serializers.ValidationError({name: ["only peer_lost and rank_replaced name this"]})
        details = {name: attrs.pop(name) for name in RUNTIME_DETAILS if name in attrs}
        if "detail" in details:
            details["detail"] = details["detail"][:500]
        attrs["details"] = details
        return attrs


# --- incidents as on-call work (jobs.services.incident_work) ----------------------------------------------------


class IncidentNoteSerializer(serializers.ModelSerializer):
    author = serializers.CharField(source="author.username", read_only=True, default=None)
    by_provider = serializers.SerializerMethodField(
        help_text="written by a provider user (seen by every tenant that sees the incident)"
    )

    class Meta:
        model = IncidentNote
        fields = ["id", "author", "by_provider", "body", "created_at"]
        read_only_fields = fields

    def get_by_provider(self, note) -> bool:
        return note.tenant_id is None


class IncidentTimesSerializer(serializers.Serializer):
    acknowledge = serializers.FloatField(
        allow_null=True, help_text="seconds from its first report to acknowledged"
    )
    recover = serializers.FloatField(
        allow_null=True, help_text="seconds to recovered: its reports stopped and every recovery of it ended"
    )
    resolve = serializers.FloatField(allow_null=True, help_text="seconds to resolved by a person")


class IncidentWorkSerializer(serializers.ModelSerializer):
    """Where the on-call work on an incident stands."""

    acknowledged_by = serializers.CharField(source="acknowledged_by.username", read_only=True, default=None)
    assignee_name = serializers.CharField(source="assignee.username", read_only=True, default=None)
    closed_by = serializers.CharField(source="closed_by.username", read_only=True, default=None)
    times = serializers.SerializerMethodField(help_text="seconds from its first report to each step")
    url = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "state",
            "work_state",
            "opened_at",
            "acknowledged_at",
            "acknowledged_by",
            "assignee",
            "assignee_name",
            "resolved_at",
            "closed_at",
            "closed_by",
            "cause",
            "times",
            "url",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "state": {"help_text": "the fault path's: open while reports arrive or a recovery of it runs"},
            "resolved_at": {"help_text": "when it recovered (the fault path closed it)"},
            "closed_at": {"help_text": "when a person resolved it, with a cause"},
        }

    @extend_schema_field(IncidentTimesSerializer)
    def get_times(self, incident) -> dict:
        return selectors.incident_times(incident)

    def get_url(self, incident) -> str:
        return reverse("api:incident-detail", args=[incident.pk])


class IncidentAssignSerializer(serializers.Serializer):
    user = serializers.IntegerField(
        allow_null=True, min_value=1, max_value=2**63 - 1, help_text="the user's id (null: assign to nobody)"
    )


class IncidentNoteCreateSerializer(serializers.Serializer):
    body = serializers.CharField(max_length=10_000, help_text="Markdown; raw HTML is shown as text")


class IncidentResolveSerializer(serializers.Serializer):
    cause = serializers.ChoiceField(choices=IncidentCause.choices)
