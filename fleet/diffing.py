"""Differences between JSON documents, as lists of changes a page or an API client can show."""

_MISSING = object()


def json_diff(desired, observed, path: str = "") -> list[dict]:
    """``[{"path", "op": added|removed|changed, "desired", "observed"}]``, leaves only, in a stable order.

    ``added`` means present in ``observed`` only, ``removed`` present in ``desired`` only.
    """
    if isinstance(desired, dict) and isinstance(observed, dict):
        changes = []
        for key in sorted(set(desired) | set(observed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            changes += json_diff(desired.get(key, _MISSING), observed.get(key, _MISSING), sub)
        return changes
    if desired is _MISSING:
        return [{"path": path, "op": "added", "observed": observed}]
    if observed is _MISSING:
        return [{"path": path, "op": "removed", "desired": desired}]
    if desired != observed or type(desired) is not type(observed):
        return [{"path": path, "op": "changed", "desired": desired, "observed": observed}]
    return []


def version_diff(old, new) -> dict:
    """What changed from one blueprint version to another: add-ons, node software and policy."""
    old_addons, new_addons = old.effective_addons(), new.effective_addons()
    addons = []
    for name in sorted(set(old_addons) | set(new_addons)):
        before, after = old_addons.get(name), new_addons.get(name)
        if before is None:
            addons.append({"name": name, "change": "added", "addon": after})
        elif after is None:
            addons.append({"name": name, "change": "removed", "addon": before})
        else:
            changes = json_diff(before, after)
            if changes:
                addons.append({"name": name, "change": "changed", "changes": _renamed(changes)})
    return {
        "from": old.number,
        "to": new.number,
        "addons": addons,
        "node_software": _renamed(json_diff(old.effective_node_software(), new.effective_node_software())),
        "policy": _renamed(json_diff(old.effective_policy(), new.effective_policy())),
    }


def _renamed(changes: list[dict]) -> list[dict]:
    """Version diffs read old → new rather than desired → observed."""
    out = []
    for change in changes:
        entry = {"path": change["path"], "op": change["op"]}
        if "desired" in change:
            entry["old"] = change["desired"]
        if "observed" in change:
            entry["new"] = change["observed"]
        out.append(entry)
    return out
