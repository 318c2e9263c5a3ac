"""Recovery actions (what Lockstep did about a fault, and why), spare bookings, and the per-node ladder."""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.choices import ActionKind, ActionState, EscalationStage, SavingState


class RecoveryAction(models.Model):
    """One recovery for one job (or one node-level step of the escalation ladder, with no job).

    At most one recovery under way per job; a failed or superseded attempt is followed by one that names it as
    ``previous`` (docs/incidents.md). ``alternatives`` are the options the planner weighed, with their
    expected GPU-hours lost. The ledger fields follow docs/gpu-hours.md.
    """

    TRANSITIONS = {
        ActionState.PLANNED: {ActionState.RUNNING, ActionState.SUCCEEDED, ActionState.FAILED},
        ActionState.RUNNING: {ActionState.SUCCEEDED, ActionState.FAILED},
        ActionState.SUCCEEDED: set(),
        ActionState.FAILED: set(),
    }

    fault = models.ForeignKey(
        "jobs.FaultEvent", null=True, blank=True, on_delete=models.CASCADE, related_name="actions"
    )
    incident = models.ForeignKey(
        "jobs.Incident", null=True, blank=True, on_delete=models.SET_NULL, related_name="actions"
    )
    previous = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # one_successor_per_attempt's unique index serves its lookups
        help_text="the attempt of the same recovery this one replaced (failed or superseded)",
    )
    attempt = models.PositiveSmallIntegerField(
        default=1, db_default=1, help_text="1 for a recovery's first attempt"
    )
    job = models.ForeignKey(
        "jobs.Job", null=True, blank=True, on_delete=models.CASCADE, related_name="actions"
    )
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="recovery_actions")
    kind = models.CharField(max_length=24, choices=ActionKind.choices)
    impact = models.CharField(
        max_length=10,
        blank=True,
        db_default="",
        help_text="what the faults meant for the job (planner.Impact)",
    )
    state = models.CharField(max_length=10, choices=ActionState.choices, default=ActionState.PLANNED)
    dry_run = models.BooleanField(default=False, help_text="decided and recorded; nothing was done")
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    to_node = models.ForeignKey(
        "fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    to_gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    nic_name = models.CharField(max_length=30, blank=True)
    to_nic_name = models.CharField(max_length=30, blank=True)
    snapshot = models.ForeignKey(
        "jobs.JobSnapshot", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    handle = models.CharField(max_length=100, blank=True)
    detected_at = models.DateTimeField(
        help_text="when the fault was detected: the ledger's clock starts here"
    )
    planned_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True, help_text="when the driver expects it to finish")
    ended_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="failed as timed out if not done by then"
    )
    retry_at = models.DateTimeField(
        null=True, blank=True, help_text="a planned retry waits until then (back-off)"
    )
    # Ledger, in GPU-hours (docs/gpu-hours.md).
    gpus = models.PositiveIntegerField(default=0)
    pause_seconds = models.FloatField(default=0.0)
    work_lost_seconds = models.FloatField(default=0.0)
    degraded_seconds = models.FloatField(default=0.0)
    slowdown = models.FloatField(default=0.0)
    snapshot_overhead_seconds = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="measured: training time the job's in-memory snapshots cost since its previous recovery",
    )
    restore_iteration = models.PositiveBigIntegerField(null=True, blank=True)
    gpu_hours_lost = models.FloatField(default=0.0)
    gpu_hours_baseline = models.FloatField(default=0.0)
    gpu_hours_saved = models.FloatField(default=0.0)
    gpu_hours_at_stake = models.FloatField(default=0.0)
    saving = models.CharField(
        max_length=12,
        choices=SavingState.choices,
        default=SavingState.REALIZED,
        db_default=SavingState.REALIZED,
    )
    gpu_hours_expected = models.FloatField(
        default=0.0, db_default=0.0, help_text="a proactive move's expected saving (docs/gpu-hours.md)"
    )
    risk_score = models.FloatField(
        null=True, blank=True, help_text="the node's risk when a proactive move was chosen"
    )
    reason = models.TextField(blank=True)
    estimate = models.JSONField(
        default=dict,
        blank=True,
        db_default={},
        help_text="the planner's estimates it was chosen with, and their basis (measured or default)",
    )
    failed_back_at = models.DateTimeField(
        null=True, blank=True, help_text="a NIC failover: when the job failed back"
    )
    resumed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a restart or rank replacement: the job's first training step after it, from its own report "
        "(the pause ends here)",
    )
    alternatives = models.JSONField(default=list, blank=True)
    error = models.CharField(max_length=300, blank=True)

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["-planned_at", "-id"]
        indexes = [
            models.Index(fields=["cluster", "state", "kind"]),
            models.Index(fields=["state", "done_at"]),
            # The few expected savings that beat settles every second (jobs.services.savings).
            models.Index(
                fields=["detected_at"], condition=Q(saving="expected"), name="action_expected_saving_idx"
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["fault", "job"],
                condition=Q(job__isnull=False, fault__isnull=False, previous__isnull=True),
                name="one_action_per_fault_and_job",
            ),
            # One incident, one recovery: a job has at most one recovery under way; a new fault folds into it
            # or replaces it (and each attempt is replaced at most once).
            # (A NIC failover is a link's recovery, which runs beside the job's: the job keeps its other rails.)
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(job__isnull=False, dry_run=False, state__in=("planned", "running"))
                & ~Q(kind="nic_failover"),
                name="one_active_recovery_per_job",
            ),
            models.UniqueConstraint(
                fields=["previous"], condition=Q(previous__isnull=False), name="one_successor_per_attempt"
            ),
            models.UniqueConstraint(
                fields=["fault", "kind", "node"],
                condition=Q(job__isnull=True, fault__isnull=False),
                name="one_node_step_per_fault",
            ),
        ]

    def __str__(self):
        return f"{self.kind} for job {self.job_id} ({self.state})"

    def may_become(self, state: str) -> bool:
        return state in self.TRANSITIONS[self.state]


class SpareBooking(models.Model):
    """A spare node (or one spare GPU of a node) reserved for one action; the database allows one at a time."""

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="spare_bookings")
    gpu_index = models.PositiveSmallIntegerField(default=0, help_text="0 for a whole node")
    whole_node = models.BooleanField(default=True)
    action = models.OneToOneField(RecoveryAction, on_delete=models.CASCADE, related_name="booking")
    booked_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu_index"], condition=Q(released_at__isnull=True), name="spare_booked_once"
            ),
        ]

    def __str__(self):
        return f"node {self.node_id} booked for action {self.action_id}"


class NodeEscalation(models.Model):
    """Where a node stands on the escalation ladder, moved one step at a time by beat (jobs.escalation)."""

    node = models.OneToOneField("fleet.Node", on_delete=models.CASCADE, related_name="escalation")
    stage = models.CharField(max_length=12, choices=EscalationStage.choices, default=EscalationStage.WATCHING)
    reason = models.CharField(max_length=300, blank=True)
    fault = models.ForeignKey(
        "jobs.FaultEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu_index = models.PositiveSmallIntegerField(null=True, blank=True)
    remediation = models.CharField(max_length=40, blank=True, help_text="the catalogue's recommended action")
    strikes = models.JSONField(default=list, blank=True, help_text="times of recent non-fatal faults")
    handle = models.CharField(max_length=100, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)
    needs_human = models.BooleanField(default=False)
    blocked = models.CharField(max_length=300, blank=True, help_text="why the next step waits")
    # Validation (docs/fleet.md): the health check carried out through the driver after the repair, and, where the
    # node has an agent, clean telemetry for ESCALATION_CLEAN_TELEMETRY_SECONDS after it.
    check_handle = models.CharField(
        max_length=100, blank=True, db_default="", help_text="the driver's handle of the health check"
    )
    check_started_at = models.DateTimeField(null=True, blank=True)
    check_passed_at = models.DateTimeField(null=True, blank=True)
    has_agent = models.BooleanField(
        default=False, db_default=False, help_text="the node had reported telemetry before the check"
    )
    evidence = models.JSONField(
        default=list,
        db_default=[],
        blank=True,
        help_text="what validation saw, oldest first: {at, step, result, detail}",
    )
    updated_at = models.DateTimeField(auto_now=True)

    tenant_scope = "node__cluster__dedicated_tenant_id"

    def __str__(self):
        return f"{self.node_id}: {self.stage}"


class RecoveryEstimate(models.Model):
    """What one kind of recovery (or degraded stretch) has really taken on one cluster: a running average of the
    measured durations, which replaces the planner's default once it has enough samples."""

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="recovery_estimates")
    kind = models.CharField(max_length=30, help_text="a planner.Estimates field, e.g. migration_pause")
    samples = models.PositiveIntegerField(default=0)
    seconds = models.FloatField(
        default=0.0, help_text="exponentially weighted average of the measured seconds"
    )
    last_seconds = models.FloatField(default=0.0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "kind"], name="one_estimate_per_cluster_kind")
        ]

    def __str__(self):
        return f"{self.kind} on {self.cluster_id}: {self.seconds:.1f}s over {self.samples}"
