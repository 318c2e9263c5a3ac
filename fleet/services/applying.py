"""Putting desired add-ons onto a cluster through its driver. Callers hold the transaction, audit and publish."""

from fleet.desired import AddonCheck, desired_state, is_node_software
from fleet.drivers import DriverError, driver_for
from fleet.drivers.base import Operation
from fleet.models import BlueprintVersion, Cluster


def supports_addons(cluster: Cluster) -> bool:
    ops = driver_for(cluster).supports
    return Operation.APPLY_ADDON in ops and Operation.REMOVE_ADDON in ops


def apply_version(
    *,
    cluster: Cluster,
    version: BlueprintVersion | None,
    previous: BlueprintVersion | None,
    node_software: bool = True,
) -> list[str]:
    """Apply what ``version`` carries that ``previous`` did not (or carried differently), and remove what only
    ``previous`` carried. Node-software components are left out unless ``node_software`` (their nodes must have
    been drained first). Returns the names applied or removed; raises DriverError if the cluster refuses."""
    driver = driver_for(cluster)
    new, old = desired_state(version), desired_state(previous)
    touched = []
    for name, spec in new.items():
        if is_node_software(name) and not node_software:
            continue
        if old.get(name) != spec or previous is None:
            driver.apply_addon(spec)
            touched.append(name)
    for name in sorted(set(old) - set(new)):
        if is_node_software(name):
            continue  # the component stays at what it was; a later version pins it again
        driver.remove_addon(name, old[name].get("namespace", ""))
        touched.append(name)
    return touched


def converge(*, cluster: Cluster, checks: list[AddonCheck]) -> tuple[list[str], dict[str, str]]:
    """Re-apply the desired state of every drifted Helm add-on and remove unexpected ones.

    Node software is not touched here: changing it drains nodes, which only a rollout does within budgets.
    Returns (names corrected, {name: error}).
    """
    driver = driver_for(cluster)
    done, failed = [], {}
    for check in checks:
        if check.kind is None or is_node_software(check.name):
            continue
        try:
            if check.desired is None:
                driver.remove_addon(check.name, check.observed.namespace if check.observed else "")
            else:
                driver.apply_addon(check.desired)
        except DriverError as error:
            failed[check.name] = str(error)[:300]
        else:
            done.append(check.name)
    return done, failed
