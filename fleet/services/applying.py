"""Putting desired add-ons onto a cluster through its driver. Callers hold the transaction, audit and publish."""

from fleet.desired import (
    AddonCheck,
    apply_order,
    dependency_waits,
    is_node_software,
    respecting_ignored,
)
from fleet.drivers import DriverError, driver_for
from fleet.drivers.base import Operation
from fleet.models import BlueprintVersion, Cluster
from fleet.overlays import cluster_desired


def supports_addons(cluster: Cluster) -> bool:
    ops = driver_for(cluster).supports
    return Operation.APPLY_ADDON in ops and Operation.REMOVE_ADDON in ops


def apply_version(
    *,
    cluster: Cluster,
    version: BlueprintVersion | None,
    previous: BlueprintVersion | None,
    node_software: bool = True,
    waiting: dict[str, str] | None = None,
) -> list[str]:
    """Apply what ``version`` carries that ``previous`` did not (or carried differently), and remove what only
    ``previous`` carried. Node-software components are left out unless ``node_software`` (their nodes must have
    been drained first). Add-ons go on after what they ``depends_on`` and come off before it. Given ``waiting``
    (a dict to fill), an add-on whose dependency is applied in this same call is held back and ``waiting`` says
    why: it goes on once that dependency is healthy (``apply_waiting``). Returns the names applied or removed;
    raises DriverError if the cluster refuses."""
    driver = driver_for(cluster)
    new, old = cluster_desired(cluster, version), cluster_desired(cluster, previous)
    touched = []
    for name in apply_order(new):
        spec = new[name]
        if is_node_software(name) and not node_software:
            continue
        if old.get(name) != spec or previous is None:
            held = [d for d in spec.get("depends_on", []) if d in touched or d in (waiting or {})]
            if waiting is not None and held:
                waiting[name] = f"waits for {', '.join(held)} to be healthy"
                continue
            driver.apply_addon(spec)
            touched.append(name)
    gone = {name: old[name] for name in set(old) - set(new) if not is_node_software(name)}
    # (node software stays at what it was when a version drops it; a later version pins it again)
    for name in reversed(apply_order(gone)):
        driver.remove_addon(name, old[name].get("namespace", ""))
        touched.append(name)
    return touched


def _readiness(checks: list[AddonCheck]) -> dict[str, str]:
    return {c.name: "ready" if c.ready else f"{c.sync}/{c.health}" for c in checks}


def apply_waiting(*, cluster: Cluster, checks: list[AddonCheck]) -> tuple[list[str], dict[str, str]]:
    """Put on the add-ons held back for their dependencies whose dependencies are now InSync and Healthy.
    Returns (names applied, {name: what it still waits for})."""
    ready = _readiness(checks)
    applied, waits = [], {}
    for check in checks:
        if check.desired is None or check.kind is None or not check.desired.get("depends_on"):
            continue
        pending = dependency_waits(check.desired, ready)
        if pending:
            waits[check.name] = f"waits for {', '.join(pending)}"
            continue
        driver_for(cluster).apply_addon(respecting_ignored(check.desired, check.observed))
        applied.append(check.name)
    return applied, waits


def converge(*, cluster: Cluster, checks: list[AddonCheck]) -> tuple[list[str], dict[str, str]]:
    """Re-apply the desired state of every drifted Helm add-on and remove unexpected ones.

    Node software is not touched here: changing it drains nodes, which only a rollout does within budgets.
    Returns (names corrected, {name: error}).
    """
    driver = driver_for(cluster)
    done, failed = [], {}
    ready = _readiness(checks)
    by_name = {check.name: check for check in checks}
    for name in apply_order({c.name: c.desired or {} for c in checks}):
        check = by_name[name]
        if check.kind is None or is_node_software(check.name):
            continue
        if check.desired is not None and dependency_waits(check.desired, ready):
            continue  # after what it depends on is healthy: a later sweep
        try:
            if check.desired is None:
                driver.remove_addon(check.name, check.observed.namespace if check.observed else "")
            else:
                driver.apply_addon(respecting_ignored(check.desired, check.observed))
        except DriverError as error:
            failed[check.name] = str(error)[:300]
        else:
            done.append(check.name)
    return done, failed
