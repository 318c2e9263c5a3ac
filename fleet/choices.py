from django.db import models


class ClusterKind(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes"
    SLURM_ON_KUBERNETES = "slurm-on-kubernetes", "Slurm on Kubernetes"
    SLURM = "slurm", "Slurm"


class DriverName(models.TextChoices):
    SIMULATED = "simulated", "Simulated"
    KUBERNETES = "kubernetes", "Kubernetes"
    SLURM = "slurm", "Slurm"


class AutomationMode(models.TextChoices):
    """What recovery automation does on a cluster or fleet: act, decide and record only, or nothing."""

    ACTIVE = "active", "Active"
    DRY_RUN = "dry-run", "Dry run"
    PAUSED = "paused", "Paused"


class NodeState(models.TextChoices):
    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
    FAILED = "failed", "Failed"
    SPARE = "spare", "Spare"


class GPUHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"


class Reachability(models.TextChoices):
    """Whether Lockstep hears a cluster (its own view, apart from the driver's connection settings)."""

    REACHABLE = "reachable", "Reachable"
    UNREACHABLE = "unreachable", "Unreachable"


class LinkState(models.TextChoices):
    UP = "up", "Up"
    DEGRADED = "degraded", "Degraded"
    DOWN = "down", "Down"


class VersionState(models.TextChoices):
    DRAFT = "draft", "Draft"
    ACTIVE = "active", "Active"
    DISABLED = "disabled", "Disabled"


class SyncStatus(models.TextChoices):
    IN_SYNC = "InSync", "In sync"
    OUT_OF_SYNC = "OutOfSync", "Out of sync"
    UNKNOWN = "Unknown", "Unknown"


class HealthStatus(models.TextChoices):
    HEALTHY = "Healthy", "Healthy"
    PROGRESSING = "Progressing", "Progressing"
    DEGRADED = "Degraded", "Degraded"
    MISSING = "Missing", "Missing"
    UNKNOWN = "Unknown", "Unknown"


# Worst first: a cluster's or fleet's status is the worst of its parts.
HEALTH_RANK = {
    HealthStatus.DEGRADED: 0,
    HealthStatus.MISSING: 1,
    HealthStatus.UNKNOWN: 2,
    HealthStatus.PROGRESSING: 3,
    HealthStatus.HEALTHY: 4,
}
SYNC_RANK = {SyncStatus.OUT_OF_SYNC: 0, SyncStatus.UNKNOWN: 1, SyncStatus.IN_SYNC: 2}


class DriftKind(models.TextChoices):
    MISSING = "missing", "Missing"
    UNEXPECTED = "unexpected", "Unexpected"
    VERSION_MISMATCH = "version_mismatch", "Version mismatch"
    VALUES_CHANGED = "values_changed", "Values changed"


class DriftMode(models.TextChoices):
    NOTIFY = "notify", "Notify only"
    CORRECT = "correct", "Correct"


class RolloutState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    PAUSED = "Paused"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    ROLLED_BACK = "RolledBack"


class RolloutClusterStatus(models.TextChoices):
    TO_APPLY = "ToApply"
    PROGRESSING = "Progressing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    SKIPPED = "Skipped"
