"""Training jobs, where they run (allocations with rank ranges), their phases, progress, snapshots and tokens."""

import math

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.choices import JobPhaseKind, JobState, SnapshotKind, SnapshotReason, SnapshotState
from tenancy.models import Token


class Job(models.Model):
    """A distributed training job on a cluster.

    Two things are kept apart. ``simulated`` is the job's kind, fixed when it is made: a job Lockstep placed on a
    simulated cluster, judged by the simulated protection model (jobs.protection), against a real job registered
    on named hosts. ``reports_progress`` says where its figures come from: a job that has not reported advances
    by the clock (``iteration`` was reached at ``iteration_at`` and, while Running, one more iteration completes
    every ``seconds_per_iteration``, slower by ``slowdown`` while degraded; it checkpoints every
    ``checkpoint_interval`` iterations), and once it reports through the progress API its own figures replace the
    clock. A real job reports from the start; a simulated one may (the simulator's jobs do) and stays simulated.
    """

    TRANSITIONS = {
        JobState.PENDING: {JobState.RUNNING, JobState.CANCELLED, JobState.FAILED},
        JobState.RUNNING: {JobState.RECOVERING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED},
        JobState.RECOVERING: {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED},
        JobState.COMPLETED: set(),
        JobState.FAILED: set(),
        JobState.CANCELLED: set(),
    }

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="jobs")
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=100)
    gpus = models.PositiveIntegerField()
    simulated = models.BooleanField(
        default=True,
        help_text="placed by Lockstep on a simulated cluster (the kind: reports do not change it)",
    )
    reports_progress = models.BooleanField(
        default=False, help_text="its own progress reports drive its figures, not the clock"
    )
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.PENDING)
    state_reason = models.CharField(
        max_length=300, blank=True, db_default="", help_text="why it failed, when it did"
    )
    seconds_per_iteration = models.FloatField(default=1.0)
    checkpoint_interval = models.PositiveIntegerField(
        default=1000, help_text="iterations between checkpoints"
    )
    iteration = models.PositiveBigIntegerField(default=0)
    iteration_at = models.DateTimeField(default=timezone.now)
    last_checkpoint_iteration = models.PositiveBigIntegerField(default=0)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    total_iterations = models.PositiveBigIntegerField(null=True, blank=True)
    slowdown = models.FloatField(
        default=0.0, help_text="fraction of speed lost while degraded (0 = full speed)"
    )
    degraded_until = models.DateTimeField(null=True, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    tenant_scope = "tenant_id"

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["cluster", "state"]), models.Index(fields=["tenant", "state"])]

    def __str__(self):
        return self.name

    @property
    def ref(self) -> str:
        """How drivers name the job."""
        return f"job-{self.pk}"

    def may_become(self, state: str) -> bool:
        return state in self.TRANSITIONS[self.state]

    def degraded_at(self, now) -> bool:
        """Whether the job runs slower at ``now``: degraded until ``degraded_until``, or, while that is unset,
        until it fails back (jobs.services.links)."""
        return self.slowdown > 0 and (self.degraded_until is None or self.degraded_until > now)

    def iteration_now(self, now=None) -> int:
        """The iteration reached now: for a running job that does not report, extrapolated from the clock."""
        if self.reports_progress or self.state != JobState.RUNNING:
            return self.iteration
        now = now or timezone.now()
        elapsed = max(0.0, (now - self.iteration_at).total_seconds())
        speed = 1.0 - (self.slowdown if self.degraded_at(now) else 0.0)
        done = self.iteration + int(elapsed * speed / max(self.seconds_per_iteration, 1e-6))
        return min(done, self.total_iterations) if self.total_iterations else done

    def checkpoint_iteration_now(self, now=None) -> int:
        """The last checkpointed iteration: for a job the clock drives, the last multiple of the interval reached."""
        if self.reports_progress:
            return self.last_checkpoint_iteration
        interval = max(1, self.checkpoint_interval)
        return max(self.last_checkpoint_iteration, math.floor(self.iteration_now(now) / interval) * interval)


class JobAllocation(models.Model):
    """The GPUs of one node a job holds, and the ranks they run. Released (not deleted) when the job moves."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="job_allocations")
    gpu_indices = models.JSONField(default=list)
    rank_start = models.PositiveIntegerField()
    rank_end = models.PositiveIntegerField(help_text="inclusive")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["job_id", "rank_start"]
        indexes = [
            models.Index(
                fields=["node"], condition=Q(released_at__isnull=True), name="allocation_active_node"
            )
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "rank_start"],
                condition=Q(released_at__isnull=True),
                name="allocation_rank_unique_while_active",
            ),
        ]

    def __str__(self):
        return f"{self.job_id}@{self.node_id} ranks {self.rank_start}-{self.rank_end}"

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_indices)


class JobPhase(models.Model):
    """One stretch of a job's life on its timeline: running, recovering or degraded."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="phases")
    kind = models.CharField(max_length=12, choices=JobPhaseKind.choices)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    # A degraded phase names the link it is degraded by (the job fails back, and the phase ends, once it is clean).
    node = models.ForeignKey("fleet.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    nic_name = models.CharField(max_length=30, blank=True, default="", db_default="")

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["job_id", "started_at", "id"]
        # The open phases (one or two a job), which every decision and completion ends by job and kind: without
        # it PostgreSQL ended a batch's phases with a scan of every phase ever recorded (a growing table).
        indexes = [
            models.Index(fields=["job", "kind"], condition=Q(ended_at__isnull=True), name="jobphase_open_idx")
        ]

    def __str__(self):
        return f"job {self.job_id} {self.kind} from {self.started_at:%H:%M:%S}"


class JobProgress(models.Model):
    """A point on the job's iteration curve: reported by the job, or recorded at each state change."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="progress")
    at = models.DateTimeField()
    iteration = models.PositiveBigIntegerField()
    step_seconds = models.FloatField(null=True, blank=True)
    checkpoint = models.BooleanField(default=False)

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["job_id", "at", "id"]
        indexes = [models.Index(fields=["job", "at"])]

    def __str__(self):
        return f"job {self.job_id} at iteration {self.iteration}"


class JobSnapshot(models.Model):
    """A platform snapshot of all of a job's workers: a restore point newer than its last checkpoint."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="snapshots")
    state = models.CharField(max_length=10, choices=SnapshotState.choices, default=SnapshotState.RUNNING)
    reason = models.CharField(max_length=10, choices=SnapshotReason.choices, default=SnapshotReason.OPERATOR)
    iteration = models.PositiveBigIntegerField()
    handle = models.CharField(max_length=100, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    done_at = models.DateTimeField(null=True, blank=True, help_text="when the driver expects it to finish")
    ended_at = models.DateTimeField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    # What the job's protection runtime reported (kind other than platform): measured, not estimated.
    kind = models.CharField(
        max_length=16,
        choices=SnapshotKind.choices,
        default=SnapshotKind.PLATFORM,
        db_default=SnapshotKind.PLATFORM,
    )
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True, help_text="bytes of state, all ranks")
    locations = models.JSONField(
        default=list, db_default=[], blank=True, help_text="where each rank's copies live"
    )
    stalled_ranks = models.JSONField(
        default=list, db_default=[], blank=True, help_text="a hang: the ranks that stalled"
    )
    note = models.CharField(max_length=300, blank=True, db_default="")
    overhead_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="training time the runtime's snapshots cost since its previous report (capture and waiting for "
        "replication, in the training thread, slowest rank)",
    )
    details = models.JSONField(
        default=dict,
        db_default={},
        blank=True,
        help_text="what else the runtime reported: lost ranks and nodes, the standbys, the generation, …",
    )

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["job_id", "-started_at", "-id"]

    def __str__(self):
        return f"{self.get_kind_display().lower()} of job {self.job_id} at iteration {self.iteration} ({self.state})"

    @property
    def seconds(self) -> float | None:
        return (self.ended_at - self.started_at).total_seconds() if self.ended_at else None


class JobStandby(models.Model):
    """A standby of a protected job: a node of the job's own allocation whose rank waits, warm, to take a lost
    rank's place. Booked to the job (never a free spare of the cluster) from its runtime's reports."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="standbys")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="standby_of")
    since = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    released_why = models.CharField(max_length=200, blank=True)

    tenant_scope = "job__tenant_id"

    class Meta:
        ordering = ["job_id", "since", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"], condition=Q(released_at__isnull=True), name="one_live_standby_per_node"
            ),
        ]

    def __str__(self):
        return f"standby of job {self.job_id} on node {self.node_id}"


class JobToken(Token):
    """A bearer token bound to one job, for the job's own progress reports."""

    kind = "lsj"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tokens")

    tenant_scope = "job__tenant_id"

    def __str__(self):
        return f"job {self.job_id} token {self.prefix}…"
