from django.db import models


class JobState(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


ACTIVE_JOB_STATES = (JobState.PENDING, JobState.RUNNING, JobState.RECOVERING)


class JobPhaseKind(models.TextChoices):
    RUNNING = "running", "Running"
    RECOVERING = "recovering", "Recovering"
    DEGRADED = "degraded", "Degraded"


class FaultKind(models.TextChoices):
    NIC_DOWN = "nic_down"
    LINK_FLAP = "link_flap"
    LINK_DEGRADED = "link_degraded"
    GPU_XID = "gpu_xid"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    NVLINK_ERROR = "nvlink_error"
    NODE_UNREACHABLE = "node_unreachable"
    THERMAL = "thermal"
    FACILITY = "facility"
    STRAGGLER = "straggler"
    PREDICTED_FAILURE = "predicted_failure"
    SOFTWARE_CRASH = "software_crash"
    HANG = "hang"
    # Not a failure: the node is being drained on purpose (an operator, a rollout, the escalation ladder), and its
    # jobs move off it through the same decision as a node that is lost (jobs.services.drain).
    DRAIN = "drain"


# Kinds only Lockstep itself raises (a reporter may not: a drain request moves every job off its node).
INTERNAL_FAULT_KINDS = frozenset({FaultKind.DRAIN})


class FaultSource(models.TextChoices):
    AGENT = "agent"
    ALERTMANAGER = "alertmanager"
    SIMULATOR = "simulator"
    PREDICTOR = "predictor"
    API = "api"
    HEARTBEAT = "heartbeat"
    SLURM = "slurm"
    LOCKSTEP = "lockstep"  # Lockstep itself: the request to move jobs off a node it drains
    RUNTIME = "runtime"  # a job's protection runtime: a peer's rank stopped answering its collectives


class Severity(models.TextChoices):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class FaultState(models.TextChoices):
    NEW = "new"
    HANDLED = "handled"
    IGNORED = "ignored"


class ActionKind(models.TextChoices):
    NIC_FAILOVER = "nic_failover"
    INTRA_NODE_MIGRATION = "intra_node_migration"
    LIVE_MIGRATION = "live_migration"
    PROACTIVE_MIGRATION = "proactive_migration"
    GPU_RESET = "gpu_reset"
    CORDON = "cordon"
    DRAIN = "drain"
    RESTORE_FROM_SNAPSHOT = "restore_from_snapshot"
    RANK_REPLACEMENT = "rank_replacement"  # a standby in the job's own allocation takes the lost rank
    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    RETURN_TO_SERVICE = "return_to_service"


MIGRATION_KINDS = (ActionKind.INTRA_NODE_MIGRATION, ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION)
# Migrations to another node count against the cluster's and the leaf switch's disruption budgets.
BUDGETED_KINDS = (ActionKind.LIVE_MIGRATION, ActionKind.PROACTIVE_MIGRATION)


class ActionState(models.TextChoices):
    PLANNED = "planned"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# A recovery under way: decided and not ended.
ACTIVE_ACTION_STATES = (ActionState.PLANNED, ActionState.RUNNING)


class SnapshotState(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RECORDED = "recorded"  # a runtime report that is no restore point: a restore, a fallback, a hang


class SnapshotReason(models.TextChoices):
    OPERATOR = "operator"
    SCHEDULE = "schedule"
    PLANNER = "planner"
    RUNTIME = "runtime"  # reported by the job's protection runtime (lockstep_agent.protect)


class SnapshotKind(models.TextChoices):
    """What a JobSnapshot row is: a platform snapshot through the driver, or a report of the job's runtime."""

    PLATFORM = "platform", "Platform snapshot"
    SNAPSHOT = "snapshot", "In-memory restore point, replicated to a peer node"
    WRITE_THROUGH = "write_through", "Restore point written through to disk"
    RESTORE = "restore", "Restore from the in-memory snapshots"
    DISK_FALLBACK = "disk_fallback", "Restore from the disk checkpoint (both in-memory copies lost)"
    HANG = "hang", "Hang: a rank stopped making progress"
    PEER_LOST = "peer_lost", "Peer lost: a rank's collective failed (the runtime's report of a node loss)"
    RANK_REPLACED = "rank_replaced", "Rank replaced: a standby took the lost rank; the survivors kept running"


# The kinds that are restore points (the planner's restore_from_snapshot may use them); the others are recorded.
RESTORE_POINT_KINDS = (SnapshotKind.PLATFORM, SnapshotKind.SNAPSHOT, SnapshotKind.WRITE_THROUGH)


class EscalationStage(models.TextChoices):
    """The per-node ladder: quarantine → drain → remediate → (failed → repaired) → validated → returned."""

    WATCHING = "watching", "Watching"
    QUARANTINED = "quarantined", "Quarantined (cordoned)"
    DRAINING = "draining", "Draining"
    REMEDIATING = "remediating", "Remediating (GPU reset)"
    FAILED = "failed", "Failed (needs repair)"
    REPAIRED = "repaired", "Repaired"
    VALIDATED = "validated", "Validated"
    RETURNED = "returned", "Returned to the spare pool"


class IncidentScope(models.TextChoices):
    NODE = "node"
    NIC = "nic"


class IncidentState(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"


class SavingState(models.TextChoices):
    """How firm an action's GPU-hours saved are (docs/gpu-hours.md)."""

    REALIZED = "realized"  # what happened: the recovery answered a failure that occurred
    EXPECTED = "expected"  # a proactive move whose prediction is not settled yet
    NOT_REALIZED = "not_realized"  # settled: the predicted failure did not come, nothing was saved


# The order in which an incident's kind is the most severe of its reports (docs/incidents.md); a gpu_xid
# ranks as fatal when its triage takes the GPU out of service.
INCIDENT_SEVERITY = (
    "node_unreachable",
    "gpu_xid_fatal",
    "ecc_uncorrectable",
    "nvlink_error",
    "nic_down",
    "link_degraded",
    "link_flap",
    "software_crash",
    "gpu_xid",
    "thermal",
    "straggler",
    "facility",
    "predicted_failure",
)


# Faults of one job's own making (it crashed, it hung): when they name the job (``details["job"]``), they hit only
# that job, not the other jobs on the node, and reports of them join per job.
JOB_FAULT_KINDS = frozenset({"software_crash", "hang"})

# Fault kinds a node-level change (node software, a driver, firmware, an add-on on the node) can cause: the
# rollout gate counts these (fleet.hooks.count_faults), and a node whose health check passed must stay clear of
# them for its clean-telemetry window. Not predictions (no fault happened), not tenant software crashes or hangs
# (the job's own code), not stragglers (a job's speed), not facility faults (the building).
NODE_HARDWARE_KINDS = (
    "nic_down",
    "link_flap",
    "link_degraded",
    "gpu_xid",
    "ecc_uncorrectable",
    "nvlink_error",
    "node_unreachable",
    "thermal",
)
