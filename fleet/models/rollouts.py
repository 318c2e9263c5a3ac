"""Rollouts: moving a set of clusters to a blueprint version in batches, behind health gates."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from fleet.choices import RolloutClusterStatus, RolloutState

TERMINAL_STATES = (
    RolloutState.SUCCEEDED,
    RolloutState.FAILED,
    RolloutState.CANCELLED,
    RolloutState.ROLLED_BACK,
)
OPEN_STATES = (RolloutState.PENDING, RolloutState.RUNNING, RolloutState.PAUSED)
# Which state a rollout may move to from each state (the state machine services enforce).
ROLLOUT_TRANSITIONS = {
    RolloutState.PENDING: {RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.CANCELLED},
    RolloutState.RUNNING: {
        RolloutState.PAUSED,
        RolloutState.SUCCEEDED,
        RolloutState.FAILED,
        RolloutState.CANCELLED,
        RolloutState.ROLLED_BACK,
    },
    RolloutState.PAUSED: {RolloutState.RUNNING, RolloutState.CANCELLED, RolloutState.ROLLED_BACK},
    RolloutState.FAILED: {RolloutState.ROLLED_BACK},
    RolloutState.SUCCEEDED: {RolloutState.ROLLED_BACK},
    RolloutState.CANCELLED: {RolloutState.ROLLED_BACK},
    RolloutState.ROLLED_BACK: set(),
}
FAILED_CLUSTER_STATES = (RolloutClusterStatus.FAILED, RolloutClusterStatus.TIMED_OUT)
DONE_CLUSTER_STATES = (
    RolloutClusterStatus.SUCCEEDED,
    RolloutClusterStatus.FAILED,
    RolloutClusterStatus.TIMED_OUT,
    RolloutClusterStatus.SKIPPED,
)


class Rollout(models.Model):
    """A blueprint version, its targets and its strategy. See docs/fleet.md for how a step is taken."""

    version = models.ForeignKey("fleet.BlueprintVersion", on_delete=models.PROTECT, related_name="rollouts")
    state = models.CharField(max_length=12, choices=RolloutState.choices, default=RolloutState.PENDING)
    # {"fleet": id} | {"labels": {"k": "v"}} | {"clusters": [id, ...]} | {"tracking": true}
    targets = models.JSONField(default=dict)
    # strategy
    canary = models.JSONField(default=list, blank=True, help_text="ids of the canary clusters (batch 0)")
    batch_size = models.PositiveIntegerField(default=0, help_text="clusters per batch (0: use batch_percent)")
    batch_percent = models.PositiveSmallIntegerField(default=25)
    max_failures = models.PositiveIntegerField(
        default=0, help_text="failed clusters tolerated before it stops"
    )
    progress_deadline_seconds = models.PositiveIntegerField(default=600)
    soak_seconds = models.PositiveIntegerField(default=60)
    # {"days": [0..6] (Monday 0), "start": "HH:MM", "end": "HH:MM"} in UTC; empty: any time
    change_window = models.JSONField(default=dict, blank=True)
    auto_rollback = models.BooleanField(default=True)
    # progress
    current_batch = models.IntegerField(
        default=-1, help_text="index of the batch in flight; -1 before the first"
    )
    reason = models.CharField(max_length=500, blank=True, help_text="why it stopped, paused or rolled back")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state"])]

    def __str__(self):
        return f"rollout #{self.pk} of {self.version}"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def may_become(self, state: str) -> bool:
        return state in ROLLOUT_TRANSITIONS[self.state]


class RolloutBatch(models.Model):
    """One wave: its clusters start together and must pass the health gate before the next wave starts."""

    class Status(models.TextChoices):
        WAITING = "Waiting"
        PROGRESSING = "Progressing"
        SOAKING = "Soaking"
        PASSED = "Passed"
        FAILED = "Failed"
        STOPPED = "Stopped", "Stopped (the rollout ended before it finished)"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="batches")
    index = models.PositiveIntegerField()
    canary = models.BooleanField(default=False)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.WAITING)
    started_at = models.DateTimeField(null=True, blank=True)
    soak_until = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    faults_before = models.IntegerField(null=True, blank=True)
    faults_after = models.IntegerField(null=True, blank=True)
    gate = models.CharField(max_length=300, blank=True, help_text="what the health gate found")

    class Meta:
        ordering = ["rollout_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "index"], name="rollout_batch_index_unique")
        ]

    def __str__(self):
        return f"{self.rollout_id}/batch {self.index}"


class RolloutCluster(models.Model):
    """One cluster in a rollout. ``open`` is true while the rollout is unfinished: a cluster is in at most one."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="clusters")
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="rollout_entries")
    batch_index = models.PositiveIntegerField()
    status = models.CharField(
        max_length=12, choices=RolloutClusterStatus.choices, default=RolloutClusterStatus.TO_APPLY
    )
    previous_version = models.ForeignKey(
        "fleet.BlueprintVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    previous_track_latest = models.BooleanField(default=False)
    open = models.BooleanField(default=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="progress deadline")
    healthy_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    nodes_updated = models.JSONField(
        default=list, blank=True, help_text="node ids whose software was updated"
    )
    nodes_draining = models.JSONField(
        default=list, blank=True, help_text="node ids this rollout is draining now"
    )
    reason = models.CharField(max_length=500, blank=True)
    rolled_back_at = models.DateTimeField(null=True, blank=True)
    # A rollback whose node software differs goes back node by node, drained like the forward change; until the
    # last node is done the row is reverting (the rolled-back rollout keeps stepping for it).
    reverting = models.BooleanField(default=False)

    tenant_scope = "cluster__dedicated_tenant_id"

    class Meta:
        ordering = ["rollout_id", "batch_index", "cluster_id"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "cluster"], name="rollout_cluster_unique"),
            models.UniqueConstraint(
                fields=["cluster"], condition=Q(open=True), name="cluster_in_one_open_rollout"
            ),
        ]
        indexes = [models.Index(fields=["rollout", "batch_index", "status"])]

    def __str__(self):
        return f"{self.rollout_id}/{self.cluster_id} {self.status}"

    @property
    def touched(self) -> bool:
        return self.applied_at is not None
