"""Builders for the jobs tests: protected simulated clusters with spares, and jobs on them."""

import itertools
import threading
import time
import uuid
from contextlib import contextmanager

from django.db import close_old_connections, connection
from django.utils import timezone

from fleet.choices import HealthStatus, NodeState, SyncStatus
from fleet.models import GPU, NIC, Node, ObservedAddon
from jobs.models import JobAllocation
from jobs.services.jobs import job_submit
from tests.support.factories import make_blueprint, make_cluster, make_fleet

_n = itertools.count(1)

# A simulated cluster's `connection` whose every recovery step takes no time.
INSTANT = {
    "migration_pause_seconds": 0,
    "nic_failover_seconds": 0,
    "restart_seconds": 0,
    "gpu_reset_seconds": 0,
    "snapshot_base_seconds": 0,
    "snapshot_seconds_per_gpu": 0,
    "health_check_seconds": 0,
}


def node_of(job, rank=0):
    """The node that holds ``rank`` of ``job`` now."""
    return JobAllocation.objects.get(
        job=job, released_at__isnull=True, rank_start__lte=rank, rank_end__gte=rank
    ).node


def protect(cluster):
    """Give a cluster a protection blueprint whose add-ons are observed InSync and Healthy."""
    blueprint, version = make_blueprint(protection=True)
    cluster.blueprint, cluster.blueprint_version = blueprint, version
    cluster.save(update_fields=["blueprint", "blueprint_version"])
    now = timezone.now()
    for name in ("nic-failover", "live-migration"):
        ObservedAddon.objects.update_or_create(
            cluster=cluster,
            name=name,
            defaults={
                "chart": name,
                "version": "1.2.0",
                "sync": SyncStatus.IN_SYNC,
                "health": HealthStatus.HEALTHY,
                "observed_at": now,
            },
        )
    return cluster


def bulk_nodes(
    cluster,
    count: int,
    *,
    state=NodeState.READY,
    per_leaf: int = 32,
    prefix: str | None = None,
    gpus: int = 8,
    nics: int = 8,
    gpu_model: str = "H100",
) -> list[Node]:
    """Many nodes at once (bulk inserts), spread over leaf switches of ``per_leaf`` nodes."""
    prefix = prefix or f"n{next(_n)}"
    nodes = Node.objects.bulk_create(
        [
            Node(
                cluster=cluster,
                hostname=f"{prefix}-{i:04d}",
                gpu_model=gpu_model,
                leaf_switch=f"leaf-{i // per_leaf}",
                rack=f"rack-{i // per_leaf}",
                spine_switch="spine-1",
                state=state,
            )
            for i in range(count)
        ]
    )
    GPU.objects.bulk_create(
        [
            GPU(node=node, index=i, uuid=f"GPU-{uuid.uuid4()}", model=gpu_model)
            for node in nodes
            for i in range(gpus)
        ]
    )
    NIC.objects.bulk_create(
        [
            NIC(node=node, name=f"mlx5_{i}", rail=i, switch_port=f"{node.leaf_switch}/p{i}")
            for node in nodes
            for i in range(nics)
        ]
    )
    return nodes


def protected_cluster(*, nodes: int = 8, spares: int = 2, tenant=None, **fields):
    fleet = make_fleet()
    connection = fields.pop(
        "connection",
        {
            "migration_pause_seconds": 1,
            "nic_failover_seconds": 0.2,
            "restart_seconds": 1,
            "gpu_reset_seconds": 1,
            "snapshot_base_seconds": 0.5,
        },
    )
    cluster = make_cluster(fleet, dedicated_tenant=tenant, connection=connection, **fields)
    protect(cluster)
    bulk_nodes(cluster, nodes, prefix=f"{cluster.name}-n")
    bulk_nodes(cluster, spares, state=NodeState.SPARE, prefix=f"{cluster.name}-s")
    return cluster


def submit(cluster, tenant, *, gpus: int = 16, name: str | None = None, **fields):
    job, token = job_submit(
        actor=None, tenant=tenant, cluster=cluster, name=name or f"job-{next(_n)}", gpus=gpus, **fields
    )
    job.token = token
    return job


@contextmanager
def beat_in_a_thread(
    *, cluster_ids=None, interval: float = 0.2, drains: bool = False, errors: list | None = None
):
    """Beat's recovery work in a thread while the block runs: advance recovery (for ``cluster_ids``, or all),
    with ``drains`` step the draining nodes, and sweep the faults still new, every ``interval`` seconds. With
    ``errors``, what a step raises is appended there and the thread goes on, as beat does after a failed task."""
    from jobs.services.advance import recovery_advance
    from jobs.services.drain import drains_advance
    from jobs.services.faults import fault_sweep

    stop = threading.Event()

    def step():
        recovery_advance(cluster_ids=cluster_ids)
        if drains:
            drains_advance()
        fault_sweep(min_age_seconds=3)

    def beat():
        try:
            while not stop.is_set():
                if errors is None:
                    close_old_connections()
                    step()
                else:
                    # Everything an iteration does may raise, closing old connections too: between tests, while
                    # pytest-django blocks database access, even that touches the database. A thread that died
                    # there would leave the next test with no beat at all.
                    try:
                        close_old_connections()
                        step()
                    except Exception as error:  # the test shows it
                        errors.append(repr(error))
                time.sleep(interval)
        finally:
            connection.close()

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
