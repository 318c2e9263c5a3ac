"""The driver interface.

Every operation returns at once. Long operations (a Helm upgrade, a NIC failover, a live migration, a
snapshot) return an OperationResult with a ``handle`` and the time they are expected to finish; the caller
stores that as a deadline in its own row and asks ``operation_status(handle)`` later from a beat-driven task,
so no worker sleeps and no task is queued with a countdown.
"""

import enum
from dataclasses import dataclass, field
from datetime import datetime

from fleet.choices import DriverName


class Operation(enum.StrEnum):
    APPLY_ADDON = "apply_addon"
    REMOVE_ADDON = "remove_addon"
    OBSERVE_ADDONS = "observe_addons"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    DRAIN = "drain"
    TAINT = "taint"
    NIC_FAILOVER = "nic_failover"
    MIGRATE_WORKER = "migrate_worker"
    GPU_RESET = "gpu_reset"
    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    SNAPSHOT = "snapshot"
    RESTORE_FROM_SNAPSHOT = "restore_from_snapshot"
    # Move a running job off a node by relaunching it without the node (Slurm: a requeue), after its protection
    # runtime has written its snapshot through: the proactive move of a job that cannot move one worker live.
    RELAUNCH_WITHOUT_NODE = "relaunch_without_node"
    HEALTH_CHECK = "health_check"


class DriverError(Exception):
    """The cluster refused or could not be reached; ``transient`` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ObservedState:
    """One add-on as a driver sees it on the cluster. ``health`` uses fleet.choices.HealthStatus values."""

    name: str
    chart: str = ""
    version: str = ""
    namespace: str = ""
    values: dict = field(default_factory=dict)
    health: str = "Unknown"
    # What the cluster's own tooling says about an unhealthy add-on (Helm's description of a failed or stuck
    # release), shown with the cluster's status.
    message: str = ""


@dataclass(frozen=True)
class OperationResult:
    handle: str
    done_at: datetime | None = None
    detail: str = ""


class ClusterDriver:
    """Base class. A driver lists what it supports in ``supports``; the planner offers only those."""

    name: str = ""
    supports: frozenset[Operation] = frozenset()

    def __init__(self, cluster):
        self.cluster = cluster

    def _unsupported(self, operation: Operation):
        raise DriverError(f"the {self.name} driver does not support {operation.value}")

    # add-ons
    def apply_addon(self, addon: dict) -> OperationResult:
        self._unsupported(Operation.APPLY_ADDON)

    def remove_addon(self, name: str, namespace: str = "") -> OperationResult:
        self._unsupported(Operation.REMOVE_ADDON)

    def observe_addons(self) -> list[ObservedState]:
        self._unsupported(Operation.OBSERVE_ADDONS)

    @classmethod
    def observe_many(cls, clusters) -> dict[int, list[ObservedState]]:
        """Observe several clusters of this driver; drivers that can batch the look-up override this."""
        return {cluster.pk: cls(cluster).observe_addons() for cluster in clusters}

    # nodes
    def cordon(self, node) -> OperationResult:
        self._unsupported(Operation.CORDON)

    def uncordon(self, node) -> OperationResult:
        self._unsupported(Operation.UNCORDON)

    def drain(self, node) -> OperationResult:
        self._unsupported(Operation.DRAIN)

    def taint(self, node, key: str, value: str, effect: str) -> OperationResult:
        self._unsupported(Operation.TAINT)

    def drain_done(self, node) -> bool:
        """Has the node's last drain finished (nothing left to evict)? Asked on later steps, never waited for."""
        self._unsupported(Operation.DRAIN)

    # fault tolerance
    def fail_over_nic(self, node, nic_name: str, to_nic_name: str) -> OperationResult:
        self._unsupported(Operation.NIC_FAILOVER)

    def migrate_worker(self, job_ref: str, from_node, to_node, gpus: int) -> OperationResult:
        self._unsupported(Operation.MIGRATE_WORKER)

    def reset_gpu(self, node, gpu_index: int) -> OperationResult:
        self._unsupported(Operation.GPU_RESET)

    def restart_from_checkpoint(self, job_ref: str, exclude=(), nodes=()) -> OperationResult:
        """Restart the whole job from its last checkpoint, on none of the ``exclude`` hosts (its failed or
        quarantined nodes; a scheduler that places the job itself, like Slurm, is told to keep off them) and, when
        given, on exactly the ``nodes`` Lockstep placed it on (its other nodes and the spares it booked)."""
        self._unsupported(Operation.RESTART_FROM_CHECKPOINT)

    def snapshot(self, job_ref: str, gpus: int) -> OperationResult:
        self._unsupported(Operation.SNAPSHOT)

    def relaunch_without_node(self, job_ref: str, exclude=(), nodes=()) -> OperationResult:
        """Relaunch the running job on none of the ``exclude`` hosts; its protection runtime restores it from the
        snapshot it has just written through (a proactive move off a node predicted to fail)."""
        self._unsupported(Operation.RELAUNCH_WITHOUT_NODE)

    def restore_from_snapshot(self, job_ref: str, snapshot_ref: str, exclude=(), nodes=()) -> OperationResult:
        """Restart the whole job from a restore point newer than its checkpoint (``snapshot_ref``: a platform
        snapshot's handle; empty for the job's own protection runtime, which restores itself), on none of the
        ``exclude`` hosts."""
        self._unsupported(Operation.RESTORE_FROM_SNAPSHOT)

    # validation
    def health_check(self, node) -> OperationResult:
        """Start a health check of a repaired node, carried out on the node itself (on Slurm, a short job pinned
        to it; on Kubernetes, a check pod); its handle's ``operation_status`` says whether it passed."""
        self._unsupported(Operation.HEALTH_CHECK)

    def operation_status(self, handle: str) -> str:
        """'running', 'succeeded' or 'failed'."""
        raise NotImplementedError

    def operation_statuses(self, handles: list[str]) -> dict[str, str]:
        """``operation_status`` of many operations at once (a driver that can ask in one call overrides this)."""
        return {handle: self.operation_status(handle) for handle in handles}


def driver_class(name: str) -> type[ClusterDriver]:
    from fleet.drivers.kubernetes import KubernetesDriver
    from fleet.drivers.simulated import SimulatedDriver
    from fleet.drivers.slurm import SlurmDriver

    return {
        DriverName.SIMULATED: SimulatedDriver,
        DriverName.KUBERNETES: KubernetesDriver,
        DriverName.SLURM: SlurmDriver,
    }[name]


def driver_for(cluster) -> ClusterDriver:
    return driver_class(cluster.driver)(cluster)
