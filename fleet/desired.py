"""Desired state of a cluster (its version's effective add-ons plus node software) and its comparison with what a
driver observed. Pure functions over loaded rows: the drift sweep and rollout health gates share them."""

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from fleet.choices import DriftKind, HealthStatus, SyncStatus
from fleet.diffing import json_diff
from fleet.drivers.base import ObservedState
from fleet.models import BlueprintVersion
from fleet.specs import NODE_SOFTWARE_PREFIX


def load_versions(ids: Iterable[int]) -> dict[int, BlueprintVersion]:
    """The versions and all their ancestors, with ``parent`` wired so effective_*() runs no query."""
    found: dict[int, BlueprintVersion] = {}
    wanted = {i for i in ids if i}
    while wanted:
        for version in BlueprintVersion.objects.filter(pk__in=wanted).select_related("blueprint"):
            found[version.pk] = version
        wanted = {v.parent_id for v in found.values() if v.parent_id and v.parent_id not in found}
    for version in found.values():
        if version.parent_id:
            version.parent = found[version.parent_id]
    return found


def node_software_addons(software: dict) -> dict[str, dict]:
    """Node software as add-on-shaped specs (``node-software.cuda`` at version 12.4), checked like any add-on."""
    return {
        f"{NODE_SOFTWARE_PREFIX}{key}": {
            "name": f"{NODE_SOFTWARE_PREFIX}{key}",
            "repo": "",
            "chart": "",
            "version": str(value),
            "namespace": "",
            "values": {},
        }
        for key, value in sorted(software.items())
    }


def desired_state(version: BlueprintVersion | None) -> dict[str, dict]:
    """Everything the cluster should carry, by name: Helm add-ons and node-software components. Each add-on's
    ``ignore_differences`` holds its own ignore rules and the version policy's for it and for every add-on."""
    if version is None:
        return {}
    rules = version.effective_policy().get("ignore_differences") or {}
    addons = {}
    for name, spec in version.effective_addons().items():
        paths = [*spec.get("ignore_differences", []), *rules.get("*", []), *rules.get(name, [])]
        addons[name] = {**spec, "ignore_differences": list(dict.fromkeys(paths))} if paths else spec
    return {**addons, **node_software_addons(version.effective_node_software())}


def apply_order(specs: dict[str, dict]) -> list[str]:
    """The names of ``specs`` with every add-on after what it ``depends_on`` (among them), otherwise by name; a
    loop (refused at activation) leaves its members by name at the end."""
    remaining = {name: {d for d in spec.get("depends_on", []) if d in specs} for name, spec in specs.items()}
    order = []
    while remaining:
        free = sorted(name for name, needs in remaining.items() if not needs)
        if not free:
            order += sorted(remaining)
            break
        for name in free:
            order.append(name)
            del remaining[name]
        for needs in remaining.values():
            needs.difference_update(free)
    return order


def dependency_waits(spec: dict, ready: dict[str, str]) -> list[str]:
    """What an add-on waits for: each dependency not InSync and Healthy on the cluster, with its state
    (``ready``: name → "ready" or its "sync/health")."""
    return [
        f"{d} ({ready.get(d, 'not observed')})" for d in spec.get("depends_on", []) if ready.get(d) != "ready"
    ]


VALUES = "values."


def is_ignored(path: str, patterns: Iterable[str]) -> bool:
    """Does a diff path (``values.controller.replicaCount``) fall under an ignore rule (``controller``,
    ``*.replicaCount``)? A rule covers the path it names and everything below it."""
    inner = path[len(VALUES) :] if path.startswith(VALUES) else path
    return any(fnmatchcase(inner, pattern) or fnmatchcase(inner, f"{pattern}.*") for pattern in patterns)


def leaf_diff(desired: dict, observed: dict) -> list[dict]:
    """``json_diff`` of two add-ons' values down to leaves: a mapping added or removed whole is listed key by key,
    so an ignore rule can name one field inside it."""
    out = []
    pending = json_diff(desired, observed, "values")
    while pending:
        change = pending.pop(0)
        side = "observed" if change["op"] == "added" else "desired"
        value = change.get(side)
        if change["op"] != "changed" and isinstance(value, dict) and value:
            pending[:0] = [
                {"path": f"{change['path']}.{key}", "op": change["op"], side: value[key]}
                for key in sorted(value, key=str)
            ]
            continue
        out.append(change)
    return out


def respecting_ignored(desired: dict, observed: ObservedState | None) -> dict:
    """The add-on spec to apply when correcting drift: its desired values, with what the cluster holds at ignored
    paths kept (a controller that owns a field keeps it, as Argo CD's RespectIgnoreDifferences)."""
    patterns = desired.get("ignore_differences") or []
    if not patterns or observed is None:
        return desired
    values = copy.deepcopy(desired.get("values") or {})
    for change in leaf_diff(desired.get("values") or {}, observed.values or {}):
        if not is_ignored(change["path"], patterns):
            continue
        keys = change["path"][len(VALUES) :].split(".")
        parent = values
        for key in keys[:-1]:
            if not isinstance(parent.get(key), dict):
                parent[key] = {}
            parent = parent[key]
        if change["op"] == "removed":
            parent.pop(keys[-1], None)
        else:
            parent[keys[-1]] = change["observed"]
    return {**desired, "values": values}


def is_node_software(name: str) -> bool:
    return name.startswith(NODE_SOFTWARE_PREFIX)


@dataclass(frozen=True)
class AddonCheck:
    """One add-on on one cluster: its two axes, and the drift (kind + diff) when it is OutOfSync."""

    name: str
    sync: str
    health: str
    kind: str | None = None
    diff: list = field(default_factory=list)
    desired: dict | None = None
    observed: ObservedState | None = None
    # Differences the add-on's ignore rules silence: not drift, shown on request (GET /api/v1/drift/ignored/).
    ignored: list = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.sync == SyncStatus.IN_SYNC and self.health == HealthStatus.HEALTHY


def compare(desired: dict[str, dict], observed: list[ObservedState]) -> list[AddonCheck]:
    """Compare desired specs with observed add-ons; one check per name in either, sorted by name."""
    seen = {state.name: state for state in observed}
    checks = []
    for name in sorted(set(desired) | set(seen)):
        want, have = desired.get(name), seen.get(name)
        if have is None:
            checks.append(
                AddonCheck(
                    name,
                    SyncStatus.OUT_OF_SYNC,
                    HealthStatus.MISSING,
                    DriftKind.MISSING,
                    [{"path": "", "op": "removed", "desired": want.get("version", "")}],
                    want,
                )
            )
            continue
        if want is None:
            checks.append(
                AddonCheck(
                    name,
                    SyncStatus.OUT_OF_SYNC,
                    have.health,
                    DriftKind.UNEXPECTED,
                    [{"path": "", "op": "added", "observed": have.version}],
                    None,
                    have,
                )
            )
            continue
        wanted = (want.get("chart", ""), str(want.get("version", "")), want.get("namespace", ""))
        if wanted != (have.chart, have.version, have.namespace):
            identity = json_diff(
                dict(zip(("chart", "version", "namespace"), wanted, strict=True)),
                {"chart": have.chart, "version": have.version, "namespace": have.namespace},
            )
            checks.append(
                AddonCheck(
                    name,
                    SyncStatus.OUT_OF_SYNC,
                    have.health,
                    DriftKind.VERSION_MISMATCH,
                    identity,
                    want,
                    have,
                )
            )
            continue
        ignored = []
        if (want.get("values") or {}) != (have.values or {}):
            patterns = want.get("ignore_differences") or []
            if patterns:
                values = leaf_diff(want.get("values") or {}, have.values or {})
                ignored = [change for change in values if is_ignored(change["path"], patterns)]
                values = [change for change in values if not is_ignored(change["path"], patterns)]
            else:
                values = json_diff(want.get("values") or {}, have.values or {}, "values")
            if values:
                checks.append(
                    AddonCheck(
                        name,
                        SyncStatus.OUT_OF_SYNC,
                        have.health,
                        DriftKind.VALUES_CHANGED,
                        values,
                        want,
                        have,
                        ignored,
                    )
                )
                continue
        checks.append(AddonCheck(name, SyncStatus.IN_SYNC, have.health, None, [], want, have, ignored))
    return checks
