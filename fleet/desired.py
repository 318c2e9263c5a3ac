"""Desired state of a cluster (its version's effective add-ons plus node software) and its comparison with what a
driver observed. Pure functions over loaded rows: the drift sweep and rollout health gates share them."""

from collections.abc import Iterable
from dataclasses import dataclass, field

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
    """Everything the cluster should carry, by name: Helm add-ons and node-software components."""
    if version is None:
        return {}
    return {**version.effective_addons(), **node_software_addons(version.effective_node_software())}


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
        if (want.get("values") or {}) != (have.values or {}):
            values = json_diff(want.get("values") or {}, have.values or {}, "values")
            checks.append(
                AddonCheck(
                    name, SyncStatus.OUT_OF_SYNC, have.health, DriftKind.VALUES_CHANGED, values, want, have
                )
            )
            continue
        checks.append(AddonCheck(name, SyncStatus.IN_SYNC, have.health, None, [], want, have))
    return checks
