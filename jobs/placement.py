"""Global placement: spares, disruption budgets and cooldown, decided under the cluster's row lock.

Every recovery handler of a cluster takes ``lock_cluster`` first, so placement is one decision at a time per
cluster (never one per event racing another). Spare rows are also taken with ``SELECT … FOR UPDATE SKIP
LOCKED`` and booked in SpareBooking, whose partial unique constraint lets a spare be booked only once.
"""

import logging
import math
from dataclasses import dataclass

from django.db import OperationalError, connection, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from controlplane.bulk import insert_rows, update_rows
from controlplane.prepared import PreparedQuery
from fleet.choices import GPUHealth, NodeState
from fleet.models import GPU, Cluster, Node
from jobs.choices import BUDGETED_KINDS, ActionState
from jobs.models import JobAllocation, JobStandby, RecoveryAction, SpareBooking

log = logging.getLogger(__name__)

DEFAULT_RISK_THRESHOLD = 0.8


# The locks every decision takes, compiled once per process (controlplane/prepared.py).
_CLUSTER_LOCKED = PreparedQuery(
    lambda cluster: (
        Cluster.objects.select_for_update(of=("self",), no_key=True)
        .select_related("fleet")
        .filter(pk=cluster)
    ),
    cluster=int,
)
_NODES_LOCKED = PreparedQuery(
    lambda related, ids: (
        Node.objects.select_for_update(of=("self",))
        .select_related(*related)
        .filter(pk__in_array=ids)
        .order_by("pk")
    ),
    ids=list[int],
)


def lock_cluster(cluster_id: int) -> Cluster:
    """The cluster row, locked (FOR NO KEY UPDATE: rows that merely refer to it are not held up)."""
    immediate_constraints()
    cluster = _CLUSTER_LOCKED.first(cluster=cluster_id)
    if cluster is None:
        raise Cluster.DoesNotExist(f"no cluster {cluster_id}")
    return cluster


def lock_nodes(node_ids, *, related: tuple[str, ...] = ()) -> dict[int, Node]:
    """Lock node rows (as fleet's node services do), in id order so two lockers never wait on each other;
    returns them, as read under the lock, by id, with the ``related`` rows read beside them (not locked)."""
    ids = sorted({pk for pk in node_ids if pk})
    if not ids:
        return {}
    return {node.pk: node for node in _NODES_LOCKED.rows(tuple(related), ids=ids)}


def _skip_locked(queryset):
    if connection.features.has_select_for_update_skip_locked:
        return queryset.select_for_update(skip_locked=True, of=("self",), no_key=True)
    return queryset.select_for_update()


SPARE_LOCK_WAIT_MS = 300


def _wait_briefly(queryset) -> list | None:
    """The rows, locked, waiting up to SPARE_LOCK_WAIT_MS for locks others hold (telemetry's and the risk sweep's
    short writes); None when that wait ran out (then the caller skips the locked rows). The wait is bounded so a
    decision never waits long, nor deadlocks with a writer that waits for a node the decision holds."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{SPARE_LOCK_WAIT_MS}ms'")
            found = list(queryset.select_for_update(of=("self",), no_key=True)[:512])
            cursor.execute("SET LOCAL lock_timeout = DEFAULT")
            return found
    except OperationalError:
        return None


def risk_threshold(cluster: Cluster) -> float:
    """A node at or above this risk score is never a migration target (blueprint policy ``risk_threshold``)."""
    version = cluster.blueprint_version
    if version is None:
        return DEFAULT_RISK_THRESHOLD
    try:
        return float(version.effective_policy().get("risk_threshold", DEFAULT_RISK_THRESHOLD))
    except (TypeError, ValueError):
        return DEFAULT_RISK_THRESHOLD


@dataclass
class Budget:
    cluster_running: int
    cluster_cap: int
    leaf_running: dict[str, int]
    leaf_cap: int
    queued: int

    def room(self, leaf: str) -> bool:
        return self.cluster_running < self.cluster_cap and self.leaf_running.get(leaf, 0) < self.leaf_cap

    def wait_seconds(self, pause: float) -> float:
        """Expected wait before one more migration may start, with ``queued`` ones ahead of it."""
        if self.cluster_cap <= 0:
            return math.inf
        ahead = self.cluster_running + self.queued
        if ahead < self.cluster_cap:
            return 0.0
        return math.floor(ahead / self.cluster_cap) * pause


def migration_budget(cluster: Cluster) -> Budget:
    """Running migrations to other nodes, in the cluster and per target leaf switch; and those queued."""
    rows = RecoveryAction.objects.filter(cluster=cluster, kind__in=BUDGETED_KINDS, dry_run=False)
    running = rows.filter(state=ActionState.RUNNING)
    per_leaf = dict(
        running.values_list("to_node__leaf_switch")
        .annotate(n=Count("id"))
        .values_list("to_node__leaf_switch", "n")
    )
    return Budget(
        cluster_running=sum(per_leaf.values()),
        cluster_cap=cluster.max_concurrent_migrations,
        leaf_running=per_leaf,
        leaf_cap=cluster.max_migrations_per_leaf,
        queued=rows.filter(state=ActionState.PLANNED).count(),
    )


def busy_node_ids(cluster_id: int) -> set[int]:
    return set(
        JobAllocation.objects.filter(node__cluster_id=cluster_id, released_at__isnull=True).values_list(
            "node_id", flat=True
        )
    )


def spare_order_key(candidate, near) -> tuple:
    """How spares rank for a worker leaving ``near`` (any objects with leaf_switch, rack, risk_score): closest
    in the fabric first (same leaf switch, then same rack), then lowest risk. Also used by the what-if replay."""
    return (candidate.leaf_switch != near.leaf_switch, candidate.rack != near.rack, candidate.risk_score)


def find_spare_node(
    *, cluster: Cluster, near: Node, gpus: int, exclude: set[int] = frozenset()
) -> Node | None:
    """The best spare node for a worker leaving ``near``: same GPU model, all GPUs healthy, below the risk
    threshold, out of cooldown, not booked; same leaf switch first, then lowest risk. Row-locked, skipping
    rows another handler holds."""
    now = timezone.now()
    booked = SpareBooking.objects.filter(released_at__isnull=True, whole_node=True).values("node_id")
    unhealthy = GPU.objects.exclude(health=GPUHealth.HEALTHY).values("node_id")
    rows = (
        Node.objects.filter(
            cluster=cluster,
            state=NodeState.SPARE,
            gpu_model=near.gpu_model,
            risk_score__lt=risk_threshold(cluster),
        )
        .filter(Q(cooldown_until__isnull=True) | Q(cooldown_until__lte=now))
        .exclude(pk__in=booked)
        .exclude(pk__in=unhealthy)
        .exclude(pk=near.pk)
        .exclude(pk__in=list(exclude))
    )
    candidates = list(_skip_locked(rows.order_by("risk_score", "hostname"))[:64])
    candidates = [node for node in candidates if node.gpus.count() >= gpus] if gpus > 8 else candidates
    if not candidates:
        return None
    candidates.sort(key=lambda node: spare_order_key(node, near))
    return candidates[0]


class SparePool:
    """The spare nodes of a cluster for one placement decision: read and row-locked once, then handed out
    (same GPU model, same leaf switch first, then rack, then lowest risk), never the same one twice."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._by_model: dict[str, list[Node]] = {}
        self._waited: set[str] = set()

    def _candidates(self, gpu_model: str, *, wait: bool = False) -> list[Node]:
        if gpu_model not in self._by_model or wait:
            now = timezone.now()
            booked = SpareBooking.objects.filter(released_at__isnull=True, whole_node=True).values("node_id")
            # A job's standbys are its own (booked to it from its runtime's reports), never the cluster's spares.
            standby = JobStandby.objects.filter(released_at__isnull=True).values("node_id")
            # each spare's own GPUs (an index lookup a spare), not every GPU of the cluster (16,384 at 2,048 nodes)
            unhealthy = GPU.objects.filter(node_id=OuterRef("pk")).exclude(health=GPUHealth.HEALTHY)
            rows = (
                Node.objects.filter(
                    cluster=self.cluster,
                    state=NodeState.SPARE,
                    gpu_model=gpu_model,
                    risk_score__lt=risk_threshold(self.cluster),
                )
                .filter(Q(cooldown_until__isnull=True) | Q(cooldown_until__lte=now))
                .exclude(pk__in=booked)
                .exclude(pk__in=standby)
                .exclude(Exists(unhealthy))
            )
            ordered = rows.order_by("risk_score", "hostname")
            found = _wait_briefly(ordered) if wait else None
            if found is None:
                found = list(_skip_locked(ordered)[:512])
            counts = dict(
                GPU.objects.filter(node__in=found)
                .values("node_id")
                .annotate(n=Count("id"))
                .values_list("node_id", "n")
            )
            for node in found:
                node.gpu_count = counts.get(node.pk, 0)
            self._by_model[gpu_model] = found
        return self._by_model[gpu_model]

    def pick(self, *, near: Node, gpus: int, exclude: set[int] = frozenset()) -> Node | None:
        def fitting():
            return [
                node
                for node in self._candidates(near.gpu_model)
                if node.pk not in exclude and node.pk != near.pk and node.gpu_count >= min(gpus, 8)
            ]

        fits = fitting()
        if not fits and near.gpu_model not in self._waited and connection.vendor == "postgresql":
            # The pool skips rows locked elsewhere, and a spare is locked for a moment whenever telemetry marks it
            # seen or the risk sweep scores it: before answering "no spare" (a restart that may cost hours), read
            # the pool once more, waiting a moment for such locks.
            self._waited.add(near.gpu_model)
            self._candidates(near.gpu_model, wait=True)
            fits = fitting()
        if not fits:
            return None
        return min(fits, key=lambda node: spare_order_key(node, near))


def spare_gpus_on_node(node: Node) -> list[int]:
    """Healthy GPUs of a node that no job holds and no action has booked."""
    return spare_gpus_on_nodes([node.pk]).get(node.pk, [])


def spare_gpus_on_nodes(node_ids) -> dict[int, list[int]]:
    """``spare_gpus_on_node`` for many nodes at once (three statements whatever their number), by node id."""
    ids = set(node_ids)
    if not ids:
        return {}
    taken: dict[int, set[int]] = {pk: set() for pk in ids}
    for node_id, indices in JobAllocation.objects.filter(
        node_id__in=ids, released_at__isnull=True
    ).values_list("node_id", "gpu_indices"):
        taken[node_id].update(indices)
    for node_id, index in SpareBooking.objects.filter(
        node_id__in=ids, released_at__isnull=True, whole_node=False
    ).values_list("node_id", "gpu_index"):
        taken[node_id].add(index)
    spare: dict[int, list[int]] = {pk: [] for pk in ids}
    for node_id, index in (
        GPU.objects.filter(node_id__in=ids, health=GPUHealth.HEALTHY)
        .order_by("node_id", "index")
        .values_list("node_id", "index")
    ):
        if index not in taken[node_id]:
            spare[node_id].append(index)
    return spare


def book_many(bookings: list[tuple[RecoveryAction, Node, int | None]]) -> list[SpareBooking]:
    """``book`` for many (action, node, GPU index or None for the whole node) at once, in one statement."""
    return (
        insert_rows(
            [
                SpareBooking(action=action, node=node, gpu_index=gpu_index or 0, whole_node=gpu_index is None)
                for action, node, gpu_index in bookings
            ]
        )
        if bookings
        else []
    )


def release(action: RecoveryAction) -> None:
    release_many([action])


def release_many(actions: list[RecoveryAction]) -> None:
    SpareBooking.objects.filter(action__in=actions, released_at__isnull=True).update(
        released_at=timezone.now()
    )


def allocations_move(moves: list[tuple[JobAllocation, Node]]) -> None:
    """Move workers to other nodes: each allocation is released (kept as history) and its ranks start again on its
    new node, on that node's first GPUs; a spare among them joins the job."""
    if not moves:
        return
    now = timezone.now()
    for allocation, _ in moves:
        allocation.released_at = now
    update_rows([allocation for allocation, _ in moves], ["released_at"])
    JobAllocation.objects.bulk_create(
        [
            JobAllocation(
                job_id=allocation.job_id,
                node=node,
                gpu_indices=list(range(allocation.gpu_count)),
                rank_start=allocation.rank_start,
                rank_end=allocation.rank_end,
            )
            for allocation, node in moves
        ]
    )
    for allocation, node in moves:
        join_as_replacement(node, allocation.job_id)


def leaving_allocations(job, gone: frozenset[int] = frozenset()) -> list[JobAllocation]:
    """The job's allocations on nodes a restarted job must not come back on: not ready (failed, cordoned or
    quarantined, draining), with a GPU of the allocation out of health, or ``gone``. Found in SQL, so that only
    those allocations are read, not every one of a job that may hold thousands."""
    held = {"job_allocations__job": job, "job_allocations__released_at__isnull": True}
    bad = set(Node.objects.filter(**held).exclude(state=NodeState.READY).values_list("pk", flat=True))
    held = {f"node__{key}": value for key, value in held.items()}
    sick = set(GPU.objects.filter(**held).exclude(health=GPUHealth.HEALTHY).values_list("node_id", "index"))
    suspect = bad | set(gone) | {node_id for node_id, _ in sick}
    if not suspect:
        return []
    allocations = JobAllocation.objects.filter(job=job, released_at__isnull=True, node_id__in=suspect)
    return [
        allocation
        for allocation in allocations.select_related("node").order_by("rank_start")
        if allocation.node_id in bad
        or allocation.node_id in gone
        or any((allocation.node_id, i) in sick for i in allocation.gpu_indices)
    ]


def replacements(
    job, pool: "SparePool", taken: set[int], gone: frozenset[int] = frozenset()
) -> tuple[list[tuple[JobAllocation, Node]], str]:
    """Where a restarting job goes instead of its failed or quarantined nodes (and the ``gone`` ones: a node its
    fault says is dead, not yet out of service in Lockstep): a healthy spare for each worker there (from ``pool``,
    never one in ``taken``, which grows). Returns the moves for ``allocations_move``, or none and why not: all or
    nothing."""
    moves = []
    for allocation in leaving_allocations(job, gone):
        spare = pool.pick(near=allocation.node, gpus=allocation.gpu_count, exclude=taken)
        if spare is None:
            taken.difference_update(node.pk for _, node in moves)
            return [], (
                f"no healthy spare node to restart ranks {allocation.rank_start}-{allocation.rank_end} on "
                f"({allocation.node.hostname} is {allocation.node.state})"
            )
        moves.append((allocation, spare))
        taken.add(spare.pk)
    return moves, ""


def join_as_replacement(node: Node, job_id: int) -> None:
    """A spare that a job moved onto leaves the pool: it is a ready node of the job now."""
    from controlplane.errors import ServiceError
    from fleet.services.nodes import node_uncordon

    if node.state == NodeState.SPARE:
        try:
            node_uncordon(actor=None, node=node, reason=f"joined job {job_id} as a replacement")
        except ServiceError as error:
            log.warning("spare %s stays spare: %s", node, error.detail)


def immediate_constraints() -> None:
    """Check foreign keys as rows are written, not at COMMIT (PostgreSQL defers them by default).

    A deferred check takes its KEY SHARE row locks at COMMIT, after this transaction already holds the
    event-sequence rows of its topics; another transaction holding the referenced row and waiting for those
    sequence rows would then deadlock with it. Checking at once takes the row locks first."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
