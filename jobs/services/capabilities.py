"""What a cluster offers a job's recovery: its protection (the cluster's protection selector, optionally
cached) and the action kinds its driver can carry out."""

from fleet.drivers import driver_for
from fleet.selectors import cluster_protection

_protection_cache: dict[int, tuple[float, object]] = {}


def protection_of(cluster, *, max_age: float = 0.0):
    """cluster_protection for a cluster (fleet.selectors), optionally cached for ``max_age`` seconds."""
    import time

    if max_age:
        hit = _protection_cache.get(cluster.pk)
        if hit and time.monotonic() - hit[0] < max_age:
            return hit[1]
    found = cluster_protection(cluster=cluster)
    _protection_cache[cluster.pk] = (time.monotonic(), found)
    return found


def supported_operations(cluster) -> frozenset[str]:
    """Action kinds the cluster's driver can carry out."""
    from fleet.drivers.base import Operation

    driver = driver_for(cluster)
    ops = driver.supports
    # Restart from checkpoint is always possible: without driver support the job's own launcher restarts it.
    kinds = {"restart_from_checkpoint"}
    if Operation.NIC_FAILOVER in ops:
        kinds.add("nic_failover")
    if Operation.MIGRATE_WORKER in ops:
        kinds |= {"live_migration", "intra_node_migration", "proactive_migration"}
    if Operation.GPU_RESET in ops:
        kinds.add("gpu_reset")
    if Operation.RESTORE_FROM_SNAPSHOT in ops:
        kinds.add("restore_from_snapshot")
    if callable(getattr(driver, "replace_rank", None)):
        kinds.add(
            "rank_replacement"
        )  # the driver takes the lost node out; the job's runtime replaces the rank
    if Operation.RELAUNCH_WITHOUT_NODE in ops:
        kinds.add(
            "proactive_migration"
        )  # written through, then relaunched without the node (jobs.services.moves)
    return frozenset(kinds)
