"""Effective add-on values of a cluster: its version's values with the blueprint's overlays for it layered over them
(precedence in fleet/models/overlays.py). Pure functions over loaded rows, plus one loader for many clusters."""

import copy
from collections.abc import Iterable

from fleet.models import ValuesOverlay


def merge_values(base: dict, over: dict) -> dict:
    """``over`` layered on ``base``: mappings merge key by key, anything else is replaced."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_overlays(blueprint_ids: Iterable[int]) -> dict[int, list[ValuesOverlay]]:
    """Every overlay of these blueprints, by blueprint id, in precedence order (one query)."""
    found: dict[int, list[ValuesOverlay]] = {}
    for overlay in ValuesOverlay.objects.filter(blueprint_id__in={b for b in blueprint_ids if b}):
        found.setdefault(overlay.blueprint_id, []).append(overlay)
    return found


def matching(cluster, overlays: list[ValuesOverlay]) -> list[ValuesOverlay]:
    """The overlays that apply to ``cluster``, lowest precedence first: label overlays, then cluster overlays."""
    mine = [o for o in overlays if o.matches(cluster)]
    return [o for o in mine if o.cluster_id is None] + [o for o in mine if o.cluster_id is not None]


def with_overlays(desired: dict[str, dict], cluster, overlays: list[ValuesOverlay] | None) -> dict[str, dict]:
    """The cluster's desired add-ons: ``desired`` (a version's) with the matching overlays' values layered on;
    an add-on an overlay changed names them in ``overlays``. The same dict when none applies."""
    applied = [o for o in matching(cluster, overlays or []) if o.addon in desired]
    if not applied:
        return desired
    out = dict(desired)
    for overlay in applied:
        spec = out[overlay.addon]
        out[overlay.addon] = {
            **spec,
            "values": merge_values(spec.get("values") or {}, overlay.values),
            "overlays": [*spec.get("overlays", []), overlay.name],
        }
    return out


def cluster_desired(cluster, version) -> dict[str, dict]:
    """What ``cluster`` should carry of ``version``: its desired state with the version's blueprint's overlays for
    the cluster (one query when the version is given)."""
    from fleet.desired import desired_state

    desired = desired_state(version)
    if version is None:
        return desired
    return with_overlays(desired, cluster, load_overlays([version.blueprint_id]).get(version.blueprint_id))


def _shape(spec: dict | None) -> dict:
    return {"version": spec["version"], "values": spec.get("values") or {}} if spec else {}


def effective_changes(cluster_ids: list[int], version) -> dict[int, list[dict]]:
    """What a rollout of ``version`` changes on each cluster in effective terms (overlays included), for its
    preview: ``{cluster id: [{"addon", "path", "from", "to"}]}`` (a few queries for any number of clusters)."""
    from fleet.desired import desired_state, load_versions
    from fleet.diffing import json_diff
    from fleet.models import Cluster

    clusters = list(Cluster.objects.filter(pk__in=cluster_ids).only("pk", "labels", "blueprint_version_id"))
    versions = load_versions({c.blueprint_version_id for c in clusters} | {version.pk})
    target = versions[version.pk]
    overlays = load_overlays({v.blueprint_id for v in versions.values()})
    out = {}
    for cluster in clusters:
        previous = versions.get(cluster.blueprint_version_id)
        old = (
            with_overlays(desired_state(previous), cluster, overlays.get(previous.blueprint_id))
            if previous
            else {}
        )
        new = with_overlays(desired_state(target), cluster, overlays.get(target.blueprint_id))
        changes = []
        for name in sorted(set(old) | set(new)):
            for change in json_diff(_shape(old.get(name)), _shape(new.get(name))):
                changes.append(
                    {
                        "addon": name,
                        "path": change["path"],
                        "from": change.get("desired"),
                        "to": change.get("observed"),
                    }
                )
        out[cluster.pk] = changes
    return out
