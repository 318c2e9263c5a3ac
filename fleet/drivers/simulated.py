"""The simulated driver: a fake cluster whose state lives in the database (SimulatedAddon, SimulatedOperation).

Timings and failures come from the cluster's ``connection`` settings, so tests and the demo can set them:

    apply_seconds (3), nic_failover_seconds (1), migration_pause_seconds (30), gpu_reset_seconds (20),
    restart_seconds (60), snapshot_seconds_per_gpu (0.05) with snapshot_base_seconds (2),
    bad_charts ([]) — charts whose release fails, unreachable (false) — every call raises,
    apply_fails (false) — every Helm apply or removal is refused (a correction that keeps failing),
    call_latency_seconds (0) — how long each apply blocks its caller, as a slow cluster API would,
    recovery_failure_probability (0) — the share of recovery operations (NIC failover, worker migration, GPU
    reset, restart from checkpoint, restore from snapshot) that fail partway: each is started as usual and
    reported "failed" when its status is asked; add-ons, node operations and snapshots never fail this way,
    recovery_failure_seed (none) — seeds those chances, so a demo process fails the same operations each time,
    fail_next ([]) — failures queued by ``fail_next_recovery``, counted down as recovery operations consume them,
    health_check_seconds (5) — how long the health check of a repaired node runs; it passes unless a failure was
    queued for it (``fail_next_health_check``, ``manage.py simulate fail-health-check``).

``simulate_drift`` changes a simulated cluster's state out of band (``manage.py simulate drift``);
``fail_next_recovery`` makes its next recovery operations fail or be refused (``manage.py simulate fail-next``).
"""

import copy
import random
import time
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from fleet.choices import HealthStatus
from fleet.drivers.base import ClusterDriver, DriverError, ObservedState, Operation, OperationResult

DEFAULTS = {
    "apply_seconds": 3.0,
    "nic_failover_seconds": 1.0,
    "migration_pause_seconds": 30.0,
    "gpu_reset_seconds": 20.0,
    "restart_seconds": 60.0,
    "snapshot_base_seconds": 2.0,
    "snapshot_seconds_per_gpu": 0.05,
    "health_check_seconds": 5.0,
}

RECOVERY_OPERATIONS = frozenset(
    {
        Operation.NIC_FAILOVER,
        Operation.MIGRATE_WORKER,
        Operation.GPU_RESET,
        Operation.RESTART_FROM_CHECKPOINT,
        Operation.RESTORE_FROM_SNAPSHOT,
    }
)
# Operations a queued failure can name: the recovery operations and the health check of a repaired node (which
# chance never fails: ``recovery_failure_probability`` covers recovery operations only).
FAILABLE_OPERATIONS = RECOVERY_OPERATIONS | {Operation.HEALTH_CHECK}
FAILURE_KINDS = ("fail", "refuse")
PENDING_FAILURES = "fail_next"

_chance = random.Random()
_seeded_chances: dict[tuple[int, str], random.Random] = {}


def _chance_for(cluster) -> random.Random:
    """The generator that rolls the cluster's recovery failures: its own, seeded by ``recovery_failure_seed``
    when that is set (the same failures each time within a process), else the shared unseeded one."""
    seed = (cluster.connection or {}).get("recovery_failure_seed")
    if seed is None:
        return _chance
    key = (cluster.pk, str(seed))
    if key not in _seeded_chances:
        _seeded_chances[key] = random.Random(seed)
    return _seeded_chances[key]


def forget_failure_draws() -> None:
    """Forget the seeded generators: a process that starts its clusters again (the what-if's scratch replays, one
    after another on a fresh store) draws each cluster's failures from its seed again."""
    _seeded_chances.clear()


def _change_connection(cluster, change):
    """Run ``change`` on the cluster's stored connection settings, read under the row lock (FOR NO KEY UPDATE, as
    the fault path holds it), write them back if it edited them, and leave the same dict in ``cluster.connection``.
    Returns what ``change`` returned. The column is encrypted, so the dict is written whole, never patched in SQL."""
    from fleet.models import Cluster

    with transaction.atomic():
        stored = (
            Cluster.objects.select_for_update(no_key=True).only("connection").get(pk=cluster.pk).connection
            or {}
        )
        connection = copy.deepcopy(stored)
        result = change(connection)
        if connection != stored:
            Cluster.objects.filter(pk=cluster.pk).update(connection=connection)
    cluster.connection = connection
    return result


def _health(row, now) -> str:
    if row.failed:
        return HealthStatus.DEGRADED
    return HealthStatus.HEALTHY if row.ready_at <= now else HealthStatus.PROGRESSING


class SimulatedDriver(ClusterDriver):
    name = "simulated"
    # Everything but relaunching a job to move it (a simulated job's workers migrate live).
    supports = frozenset(Operation) - {Operation.RELAUNCH_WITHOUT_NODE}

    def setting(self, key: str):
        return (self.cluster.connection or {}).get(key, DEFAULTS.get(key))

    def _reachable(self):
        if (self.cluster.connection or {}).get("unreachable"):
            raise DriverError(f"cluster {self.cluster.name} is unreachable", transient=True)

    def _operation(self, operation: Operation, target: str, seconds: float, **params) -> OperationResult:
        from controlplane.bulk import insert_rows
        from fleet.models import SimulatedOperation

        self._reachable()
        fails = operation in FAILABLE_OPERATIONS and self._recovery_fails(operation)
        done_at = timezone.now() + timedelta(seconds=float(seconds))
        (row,) = insert_rows(
            [
                SimulatedOperation(
                    cluster=self.cluster,
                    operation=operation.value,
                    target=target,
                    params=params,
                    done_at=done_at,
                    fails=fails,
                )
            ]
        )
        return OperationResult(handle=f"sim-{row.pk}", done_at=done_at, detail=f"{operation.value} {target}")

    def _recovery_fails(self, operation: Operation) -> bool:
        """Whether this recovery operation is to fail partway: a pending failure says so (and one to be refused
        raises DriverError here), else chance at the cluster's ``recovery_failure_probability``."""
        how = self._take_pending_failure(operation)
        if how == "refuse":
            raise DriverError(f"cluster {self.cluster.name} refused {operation.value} (simulated)")
        if how == "fail":
            return True
        if operation not in RECOVERY_OPERATIONS:
            return False
        probability = float(self.setting("recovery_failure_probability") or 0)
        return probability > 0 and _chance_for(self.cluster).random() < probability

    def _take_pending_failure(self, operation: Operation) -> str | None:
        """The ``how`` of the first pending failure that covers ``operation``, counted down in the cluster's row;
        None when none does. A failure queued after this driver's cluster row was read waits for a fresh read
        (the fault path reads it under its lock), so a cluster with none pending costs no query."""
        if not (self.cluster.connection or {}).get(PENDING_FAILURES):
            return None

        def take(connection: dict) -> str | None:
            pending = connection.get(PENDING_FAILURES) or []
            entry = next(
                (
                    item
                    for item in pending
                    if operation.value in (item.get("operations") or ())
                    or (not item.get("operations") and operation in RECOVERY_OPERATIONS)
                ),
                None,
            )
            if entry is None:
                return None
            entry["count"] -= 1
            remaining = [item for item in pending if item["count"] > 0]
            if remaining:
                connection[PENDING_FAILURES] = remaining
            else:
                del connection[PENDING_FAILURES]
            return entry["how"]

        return _change_connection(self.cluster, take)

    def operation_status(self, handle: str) -> str:
        from fleet.models import SimulatedOperation

        self._reachable()
        row = SimulatedOperation.objects.filter(
            pk=int(handle.removeprefix("sim-")), cluster=self.cluster
        ).first()
        if row is None:
            return "failed"
        if row.fails:
            return "failed"
        return "succeeded" if row.done_at <= timezone.now() else "running"

    def operation_statuses(self, handles: list[str]) -> dict[str, str]:
        from fleet.models import SimulatedOperation

        self._reachable()
        ids = {
            handle: int(handle.removeprefix("sim-"))
            for handle in handles
            if handle.startswith("sim-") and handle.removeprefix("sim-").isdigit()
        }
        rows = {
            row.pk: row
            for row in SimulatedOperation.objects.filter(pk__in=ids.values(), cluster=self.cluster).only(
                "pk", "fails", "done_at"
            )
        }
        now = timezone.now()
        statuses = {}
        for handle in handles:
            row = rows.get(ids.get(handle))
            statuses[handle] = (
                "failed" if row is None or row.fails else "succeeded" if row.done_at <= now else "running"
            )
        return statuses

    # add-ons
    def _refuse_if_configured(self, what: str):
        if self.setting("apply_fails"):
            raise DriverError(f"{what} refused by cluster {self.cluster.name}")
        latency = float(self.setting("call_latency_seconds") or 0)
        if latency:
            time.sleep(latency)

    def apply_addon(self, addon: dict) -> OperationResult:
        from fleet.models import SimulatedAddon

        self._reachable()
        self._refuse_if_configured(f"helm upgrade {addon['name']}")
        now = timezone.now()
        ready_at = now + timedelta(seconds=float(self.setting("apply_seconds")))
        failed = addon.get("chart", "") in (self.setting("bad_charts") or [])
        SimulatedAddon.objects.update_or_create(
            cluster=self.cluster,
            name=addon["name"],
            defaults={
                "chart": addon.get("chart", ""),
                "version": str(addon.get("version", "")),
                "namespace": addon.get("namespace", ""),
                "values": addon.get("values") or {},
                "ready_at": ready_at,
                "failed": failed,
            },
        )
        return OperationResult(handle=f"addon-{self.cluster.pk}-{addon['name']}", done_at=ready_at)

    def remove_addon(self, name: str, namespace: str = "") -> OperationResult:
        from fleet.models import SimulatedAddon

        self._reachable()
        self._refuse_if_configured(f"helm uninstall {name}")
        SimulatedAddon.objects.filter(cluster=self.cluster, name=name).delete()
        return OperationResult(handle=f"remove-{self.cluster.pk}-{name}", done_at=timezone.now())

    def observe_addons(self) -> list[ObservedState]:
        return self.observe_many([self.cluster])[self.cluster.pk]

    @classmethod
    def observe_many(cls, clusters) -> dict[int, list[ObservedState]]:
        """One query for any number of simulated clusters."""
        from fleet.models import SimulatedAddon

        clusters = list(clusters)
        for cluster in clusters:
            if (cluster.connection or {}).get("unreachable"):
                raise DriverError(f"cluster {cluster.name} is unreachable", transient=True)
        now = timezone.now()
        found: dict[int, list[ObservedState]] = {cluster.pk: [] for cluster in clusters}
        rows = (
            SimulatedAddon.objects.filter(cluster_id__in=found.keys())
            .order_by("cluster_id", "name")
            .values_list(
                "cluster_id", "name", "chart", "version", "namespace", "values", "ready_at", "failed"
            )
        )
        healthy, progressing, degraded = HealthStatus.HEALTHY, HealthStatus.PROGRESSING, HealthStatus.DEGRADED
        for cluster_id, name, chart, version, namespace, values, ready_at, failed in rows.iterator(
            chunk_size=5000
        ):
            health = degraded if failed else (healthy if ready_at <= now else progressing)
            found[cluster_id].append(
                ObservedState(
                    name=name, chart=chart, version=version, namespace=namespace, values=values, health=health
                )
            )
        return found

    # nodes: the simulated cluster carries the change out at once; Lockstep's Node row records the state.
    def cordon(self, node) -> OperationResult:
        return self._operation(Operation.CORDON, node.hostname, 0)

    def uncordon(self, node) -> OperationResult:
        return self._operation(Operation.UNCORDON, node.hostname, 0)

    def drain(self, node) -> OperationResult:
        return self._operation(Operation.DRAIN, node.hostname, self.setting("migration_pause_seconds"))

    def drain_done(self, node) -> bool:
        from fleet.models import SimulatedOperation

        self._reachable()
        last = (
            SimulatedOperation.objects.filter(
                cluster=self.cluster, operation=Operation.DRAIN.value, target=node.hostname
            )
            .order_by("-started_at", "-pk")
            .first()
        )
        return last is None or (last.done_at <= timezone.now() and not last.fails)

    def taint(self, node, key: str, value: str, effect: str) -> OperationResult:
        return self._operation(Operation.TAINT, node.hostname, 0, key=key, value=value, effect=effect)

    # fault tolerance
    def fail_over_nic(self, node, nic_name: str, to_nic_name: str) -> OperationResult:
        return self._operation(
            Operation.NIC_FAILOVER,
            f"{node.hostname}/{nic_name}",
            self.setting("nic_failover_seconds"),
            to=to_nic_name,
        )

    def migrate_worker(self, job_ref: str, from_node, to_node, gpus: int) -> OperationResult:
        return self._operation(
            Operation.MIGRATE_WORKER,
            job_ref,
            self.setting("migration_pause_seconds"),
            source=from_node.hostname,
            destination=to_node.hostname,
            gpus=gpus,
        )

    def reset_gpu(self, node, gpu_index: int) -> OperationResult:
        return self._operation(
            Operation.GPU_RESET, f"{node.hostname}/gpu{gpu_index}", self.setting("gpu_reset_seconds")
        )

    def restart_from_checkpoint(self, job_ref: str, exclude=(), nodes=()) -> OperationResult:
        return self._operation(
            Operation.RESTART_FROM_CHECKPOINT,
            job_ref,
            self.setting("restart_seconds"),
            **({"exclude": sorted(exclude)} if exclude else {}),
        )

    def snapshot(self, job_ref: str, gpus: int) -> OperationResult:
        seconds = (
            float(self.setting("snapshot_base_seconds"))
            + float(self.setting("snapshot_seconds_per_gpu")) * gpus
        )
        return self._operation(Operation.SNAPSHOT, job_ref, seconds, gpus=gpus)

    def restore_from_snapshot(self, job_ref: str, snapshot_ref: str, exclude=(), nodes=()) -> OperationResult:
        return self._operation(
            Operation.RESTORE_FROM_SNAPSHOT,
            job_ref,
            self.setting("migration_pause_seconds"),
            snapshot=snapshot_ref,
        )

    # validation
    def health_check(self, node) -> OperationResult:
        """The simulated cluster runs its check on the node: it passes after ``health_check_seconds`` unless a
        failure was queued for it (``fail_next_health_check``)."""
        return self._operation(Operation.HEALTH_CHECK, node.hostname, self.setting("health_check_seconds"))


DRIFT_KINDS = ("version", "values", "remove", "extra", "degrade")


def simulate_drift(cluster, *, addon: str | None = None, kind: str = "version", version: str = "") -> str:
    """Change what is 'really' on a simulated cluster behind Lockstep's back; returns what was done.

    kinds: version (bump the chart version), values (change a value), remove (uninstall), extra (install an
    add-on nobody asked for), degrade (the release fails).
    """
    from fleet.models import SimulatedAddon

    if cluster.driver != "simulated":
        raise DriverError(f"cluster {cluster.name} is not simulated")
    if kind not in DRIFT_KINDS:
        raise DriverError(f"unknown drift kind {kind!r}; one of {', '.join(DRIFT_KINDS)}")
    now = timezone.now()
    if kind == "extra":
        name = addon or "rogue-exporter"
        SimulatedAddon.objects.update_or_create(
            cluster=cluster,
            name=name,
            defaults={
                "chart": name,
                "version": version or "0.1.0",
                "namespace": "default",
                "values": {},
                "ready_at": now,
                "failed": False,
            },
        )
        return f"installed {name} on {cluster.name}"
    rows = (
        SimulatedAddon.objects.filter(cluster=cluster)
        .exclude(name__startswith="node-software.")
        .order_by("name")
    )
    row = rows.filter(name=addon).first() if addon else rows.first()
    if row is None:
        raise DriverError(f"cluster {cluster.name} carries no add-on {addon or ''}".strip())
    if kind == "version":
        row.version = version or f"{row.version}-drift"
    elif kind == "values":
        row.values = {**row.values, "driftedBy": "simulate"}
    elif kind == "degrade":
        row.failed = True
    else:
        row.delete()
        return f"removed {row.name} from {cluster.name}"
    row.save()
    return f"{kind} drift on {cluster.name}/{row.name}"


def fail_next_recovery(
    cluster, *, count: int = 1, operations: list[str] | None = None, how: str = "fail"
) -> str:
    """Make the simulated cluster's next ``count`` recovery operations (of ``operations``, values of Operation;
    None: any recovery operation) fail: ``how="fail"`` starts them and reports them failed when their status is
    asked, as a migration failing partway; ``how="refuse"`` makes the driver call raise a non-transient
    DriverError. Queued in the cluster's connection settings after any failures already pending; returns what
    was queued."""
    if cluster.driver != "simulated":
        raise DriverError(f"cluster {cluster.name} is not simulated")
    if how not in FAILURE_KINDS:
        raise DriverError(f"unknown failure {how!r}; one of {', '.join(FAILURE_KINDS)}")
    if count < 1:
        raise DriverError("count must be at least 1")
    recovery = sorted(operation.value for operation in RECOVERY_OPERATIONS)
    unknown = sorted(set(operations or ()) - set(recovery))
    if unknown:
        raise DriverError(f"not recovery operations: {', '.join(unknown)}; one of {', '.join(recovery)}")
    entry = {"how": how, "operations": sorted(set(operations or ())), "count": count}
    _change_connection(cluster, lambda connection: connection.setdefault(PENDING_FAILURES, []).append(entry))
    which = ", ".join(entry["operations"]) or "any"
    verb = "fail" if how == "fail" else "be refused"
    return f"the next {count} recovery operation(s) ({which}) on {cluster.name} will {verb}"


def fail_next_health_check(cluster, *, count: int = 1, how: str = "fail") -> str:
    """Make the simulated cluster's next ``count`` health checks of repaired nodes fail (``how="fail"``: the check
    runs and reports failed) or be refused (``how="refuse"``). Returns what was queued."""
    if cluster.driver != "simulated":
        raise DriverError(f"cluster {cluster.name} is not simulated")
    if how not in FAILURE_KINDS:
        raise DriverError(f"unknown failure {how!r}; one of {', '.join(FAILURE_KINDS)}")
    if count < 1:
        raise DriverError("count must be at least 1")
    entry = {"how": how, "operations": [Operation.HEALTH_CHECK.value], "count": count}
    _change_connection(cluster, lambda connection: connection.setdefault(PENDING_FAILURES, []).append(entry))
    verb = "fail" if how == "fail" else "be refused"
    return f"the next {count} health check(s) on {cluster.name} will {verb}"


def set_recovery_failure_probability(cluster, *, probability: float) -> None:
    """Make the share ``probability`` (0..1) of the simulated cluster's recovery operations fail from now on;
    0 removes the setting."""
    if not 0 <= probability <= 1:
        raise DriverError("recovery_failure_probability must lie between 0 and 1")

    def change(connection: dict) -> None:
        if probability:
            connection["recovery_failure_probability"] = probability
        else:
            connection.pop("recovery_failure_probability", None)

    _change_connection(cluster, change)
