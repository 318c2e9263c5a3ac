"""Validation of what a blueprint version carries and of a rollout strategy.

Each function returns the cleaned value or raises ServiceError naming the field at fault (``addons[2].version``),
so the API answers 400 and nothing is written.
"""

import re

from controlplane.errors import ServiceError
from controlplane.outbound import OutboundRefused, check_url

NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,51}[a-z0-9])?$")  # a Helm release name
CHART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")
REPO = re.compile(r"^(https?|oci)://[^\s]{1,300}$")
REPO_SCHEMES = ("https", "http", "oci")
# Semantic version, optionally with a leading v, pre-release and build (Helm charts are SemVer 2).
SEMVER = re.compile(r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
SOFTWARE_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")
NODE_SOFTWARE = ("gpu_driver", "cuda", "nccl", "nccl_net_plugin", "nic_firmware")
ADDON_KEYS = {"name", "repo", "chart", "version", "namespace", "values", "ignore_differences", "depends_on"}
MAX_DEPENDENCIES = 20
POLICY_KEYS = {"protection", "risk_threshold", "disruption", "thresholds", "ignore_differences"}
# A path in an add-on's values that drift detection ignores: dotted keys (``controller.replicaCount``), ``*`` for
# any one key or part of one (``*.image.tag``); it covers what lies below it too.
IGNORE_PATH = re.compile(r"^[A-Za-z0-9_*/-]+(\.[A-Za-z0-9_*/-]+)*$")
MAX_IGNORE_PATHS = 50
STRATEGY_KEYS = {
    "canary",
    "batch_size",
    "batch_percent",
    "max_failures",
    "progress_deadline_seconds",
    "soak_seconds",
    "change_window",
    "auto_rollback",
}
# Node software is observed and drift-checked like an add-on, under these names.
NODE_SOFTWARE_PREFIX = "node-software."


MAX_DEPTH = 32


def refuse_unknown_keys(mapping: dict, allowed, field: str) -> None:
    """ServiceError (400, naming ``field``) listing the keys of ``mapping`` that ``allowed`` does not hold."""
    unknown = set(mapping) - set(allowed)
    if unknown:
        raise ServiceError(f"unknown keys: {', '.join(sorted(map(str, unknown)))}", field=field)


def too_deep(value, limit: int = MAX_DEPTH) -> bool:
    """Is the JSON value nested deeper than ``limit``? (Iterative, so a hostile document cannot exhaust the stack.)"""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


def clean_addons(addons, field: str = "addons") -> list[dict]:
    if not isinstance(addons, list):
        raise ServiceError("must be a list of add-ons", field=field)
    cleaned, seen = [], set()
    for i, addon in enumerate(addons):
        at = f"{field}[{i}]"
        if not isinstance(addon, dict):
            raise ServiceError("must be a mapping", field=at)
        refuse_unknown_keys(addon, ADDON_KEYS, at)
        name = addon.get("name")
        if not isinstance(name, str) or not NAME.match(name) or name.startswith(NODE_SOFTWARE_PREFIX):
            raise ServiceError(
                "a release name: lower-case letters, digits and dashes, at most 53", field=f"{at}.name"
            )
        if name in seen:
            raise ServiceError(f"add-on {name} is listed twice", field=f"{at}.name")
        seen.add(name)
        repo = addon.get("repo", "")
        if not isinstance(repo, str) or (repo and not REPO.match(repo)):
            raise ServiceError("a chart repository URL (https:// or oci://)", field=f"{at}.repo")
        if repo:
            try:  # helm fetches it from inside the installation (controlplane/outbound.py)
                check_url(repo, schemes=REPO_SCHEMES, resolve=False)
            except OutboundRefused as refusal:
                raise ServiceError(
                    f"a chart repository URL Lockstep may fetch: {refusal}", field=f"{at}.repo"
                ) from None
        chart = addon.get("chart")
        if not isinstance(chart, str) or not CHART.match(chart):
            raise ServiceError(
                "a chart reference such as gpu-operator or nvidia/gpu-operator", field=f"{at}.chart"
            )
        version = addon.get("version")
        if not isinstance(version, str) or not SEMVER.match(version):
            raise ServiceError(
                "a pinned chart version such as 24.9.0 (SemVer; no ranges)", field=f"{at}.version"
            )
        namespace = addon.get("namespace", "default")
        if not isinstance(namespace, str) or not NAME.match(namespace):
            raise ServiceError("a Kubernetes namespace name", field=f"{at}.namespace")
        values = addon.get("values", {})
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ServiceError("values must be a mapping", field=f"{at}.values")
        if too_deep(values):
            raise ServiceError(f"values nest deeper than {MAX_DEPTH} levels", field=f"{at}.values")
        spec = {
            "name": name,
            "repo": repo,
            "chart": chart,
            "version": version,
            "namespace": namespace,
            "values": values,
        }
        ignore = clean_ignore_paths(addon.get("ignore_differences"), field=f"{at}.ignore_differences")
        if ignore:  # only when given, so add-ons without rules keep their stored shape
            spec["ignore_differences"] = ignore
        depends_on = addon.get("depends_on")
        if depends_on is not None:
            if (
                not isinstance(depends_on, list)
                or len(depends_on) > MAX_DEPENDENCIES
                or not all(isinstance(d, str) and NAME.match(d) and d != name for d in depends_on)
            ):
                raise ServiceError(
                    f"a list of at most {MAX_DEPENDENCIES} names of other add-ons", field=f"{at}.depends_on"
                )
            if depends_on:
                spec["depends_on"] = list(dict.fromkeys(depends_on))
        cleaned.append(spec)
    return cleaned


def check_dependencies(addons: dict[str, dict], field: str = "addons") -> None:
    """Every ``depends_on`` of a version's effective add-ons names one of them, and no chain loops back."""
    for name, spec in addons.items():
        for dependency in spec.get("depends_on", []):
            if dependency not in addons:
                raise ServiceError(
                    f"{name} depends on {dependency}, which the version does not carry", field=field
                )
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(addons):
        stack = [(start, iter(addons[start].get("depends_on", [])))]
        state[start] = state.get(start) or 1
        if state[start] == 2:
            continue
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                path = [n for n, _ in stack] + [child]
                raise ServiceError(f"depends_on loops: {' → '.join(path[path.index(child) :])}", field=field)
            elif state.get(child) is None:
                state[child] = 1
                stack.append((child, iter(addons[child].get("depends_on", []))))


def clean_ignore_paths(paths, field: str) -> list[str]:
    """Paths in an add-on's values that drift detection ignores (Argo CD's ignoreDifferences), as given."""
    if paths is None:
        return []
    if not isinstance(paths, list) or len(paths) > MAX_IGNORE_PATHS:
        raise ServiceError(f"a list of at most {MAX_IGNORE_PATHS} paths in the values", field=field)
    for i, path in enumerate(paths):
        if not isinstance(path, str) or len(path) > 300 or not IGNORE_PATH.match(path):
            raise ServiceError(
                "a dotted path in the add-on's values, such as controller.replicaCount or *.image.tag",
                field=f"{field}[{i}]",
            )
    return list(dict.fromkeys(paths))


def clean_node_software(software, field: str = "node_software") -> dict:
    if software is None:
        return {}
    if not isinstance(software, dict):
        raise ServiceError("must be a mapping of component to version", field=field)
    for key, value in software.items():
        if key not in NODE_SOFTWARE:
            raise ServiceError(f"unknown component {key!r}; one of {', '.join(NODE_SOFTWARE)}", field=field)
        if not isinstance(value, str) or not SOFTWARE_VERSION.match(value):
            raise ServiceError("a version string", field=f"{field}.{key}")
    return dict(software)


def clean_policy(policy, field: str = "policy") -> dict:
    if policy is None:
        return {}
    if not isinstance(policy, dict):
        raise ServiceError("must be a mapping", field=field)
    if too_deep(policy):
        raise ServiceError(f"nests deeper than {MAX_DEPTH} levels", field=field)
    refuse_unknown_keys(policy, POLICY_KEYS, field)
    protection = policy.get("protection", {})
    if not isinstance(protection, dict) or not all(isinstance(v, bool) for v in protection.values()):
        raise ServiceError("a mapping of protection add-on to true/false", field=f"{field}.protection")
    threshold = policy.get("risk_threshold", 0.8)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        raise ServiceError("a number between 0 and 1", field=f"{field}.risk_threshold")
    disruption = policy.get("disruption", {})
    if not isinstance(disruption, dict):
        raise ServiceError("must be a mapping", field=f"{field}.disruption")
    unavailable = disruption.get("max_unavailable_nodes", 1)
    if isinstance(unavailable, bool) or not isinstance(unavailable, int) or unavailable < 1:
        raise ServiceError(
            "a whole number of nodes, at least 1", field=f"{field}.disruption.max_unavailable_nodes"
        )
    ignore = policy.get("ignore_differences", {})
    if not isinstance(ignore, dict):
        raise ServiceError(
            'a mapping of add-on name (or "*" for every add-on) to paths', field=f"{field}.ignore_differences"
        )
    for name, paths in ignore.items():
        if not isinstance(name, str) or not (name == "*" or NAME.match(name)):
            raise ServiceError('an add-on name, or "*"', field=f"{field}.ignore_differences")
        clean_ignore_paths(paths, field=f"{field}.ignore_differences.{name}")
    return dict(policy)


def _whole(value, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ServiceError(f"a whole number from {low} to {high}", field=field)
    return value


TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")


def clean_strategy(strategy, field: str = "strategy") -> dict:
    """A strategy with defaults filled in. ``batch_size`` is a count or a percentage string such as "25%"."""
    if strategy is None:
        strategy = {}
    if not isinstance(strategy, dict):
        raise ServiceError("must be a mapping", field=field)
    refuse_unknown_keys(strategy, STRATEGY_KEYS, field)
    out = {
        "canary": [],
        "batch_size": 0,
        "batch_percent": 25,
        "max_failures": 0,
        "progress_deadline_seconds": 600,
        "soak_seconds": 60,
        "change_window": {},
        "auto_rollback": True,
    }
    canary = strategy.get("canary", [])
    if isinstance(canary, int) and not isinstance(canary, bool):
        out["canary"] = _whole(canary, f"{field}.canary", 0, 10_000)
    elif isinstance(canary, list) and all(
        isinstance(c, str | int) and not isinstance(c, bool) for c in canary
    ):
        out["canary"] = list(canary)
    else:
        raise ServiceError("a number of clusters, or a list of cluster names", field=f"{field}.canary")
    size = strategy.get("batch_size")
    if isinstance(size, str) and size.endswith("%"):
        try:
            out["batch_percent"] = _whole(int(size[:-1]), f"{field}.batch_size", 1, 100)
        except ValueError as error:
            raise ServiceError("a count or a percentage such as 25%", field=f"{field}.batch_size") from error
    elif size is not None:
        out["batch_size"] = _whole(size, f"{field}.batch_size", 1, 100_000)
    if "batch_percent" in strategy:
        out["batch_percent"] = _whole(strategy["batch_percent"], f"{field}.batch_percent", 1, 100)
    out["max_failures"] = _whole(strategy.get("max_failures", 0), f"{field}.max_failures", 0, 100_000)
    out["progress_deadline_seconds"] = _whole(
        strategy.get("progress_deadline_seconds", 600), f"{field}.progress_deadline_seconds", 1, 7 * 86400
    )
    out["soak_seconds"] = _whole(strategy.get("soak_seconds", 60), f"{field}.soak_seconds", 0, 7 * 86400)
    window = strategy.get("change_window") or {}
    if window:
        if not isinstance(window, dict) or set(window) - {"days", "start", "end"}:
            raise ServiceError("a mapping with days, start and end", field=f"{field}.change_window")
        days = window.get("days", list(range(7)))
        if not isinstance(days, list) or not all(isinstance(d, int) and 0 <= d <= 6 for d in days):
            raise ServiceError("weekdays 0 (Monday) to 6", field=f"{field}.change_window.days")
        for key in ("start", "end"):
            if not isinstance(window.get(key), str) or not TIME.match(window[key]):
                raise ServiceError("a time HH:MM (UTC)", field=f"{field}.change_window.{key}")
        out["change_window"] = {"days": days, "start": window["start"], "end": window["end"]}
    auto = strategy.get("auto_rollback", True)
    if not isinstance(auto, bool):
        raise ServiceError("true or false", field=f"{field}.auto_rollback")
    out["auto_rollback"] = auto
    return out


def in_change_window(window: dict, when) -> bool:
    """Is ``when`` (UTC) inside the window? An empty window is always open; a window may wrap midnight."""
    if not window:
        return True
    if when.weekday() not in window.get("days", range(7)):
        return False
    now = when.strftime("%H:%M")
    start, end = window["start"], window["end"]
    return start <= now < end if start <= end else (now >= start or now < end)
