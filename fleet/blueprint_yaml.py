"""Blueprints as YAML documents, for git: one strict reader (no aliases or anchors — no YAML bombs —, no
duplicate or unknown keys, bounded in bytes, nodes and depth) and one writer. ``manage.py blueprint``, the yaml
endpoint and the blueprint pages share them.

The reader parses with libyaml where PyYAML has it (the wheels do): the pure-Python parser took 11.5 s of a web
thread for a 389 KB document (issue 54). What bounds the time is the node count: building a node costs the same in
either parser, so a document is scanned first (events only, nothing built) and refused at its first node past
BLUEPRINT_YAML_MAX_NODES, its first alias or anchor, or its first level past MAX_DEPTH. bench/yaml_parse.py
measures it."""

import yaml
from django.conf import settings

from controlplane.errors import ServiceError
from fleet.specs import refuse_unknown_keys

# libyaml's parser where present; the loaders' Python constructors (and the checks below) are the same either way.
FastSafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 64  # a document's own levels above an add-on's values, which fleet.specs caps at 32
API_VERSION = "lockstep.io/v1"
TOP_KEYS = {
    "apiVersion",
    "kind",
    "name",
    "description",
    "auto_rollout",
    "drift_mode",
    "default_strategy",
    "versions",
}
VERSION_KEYS = {"number", "state", "parent", "notes", "addons", "node_software", "policy"}


def max_bytes() -> int:
    return settings.BLUEPRINT_YAML_MAX_BYTES


class StrictLoader(FastSafeLoader):
    """A safe loader that refuses duplicate keys; ``parse`` has refused aliases, anchors and oversize first."""

    def construct_mapping(self, node, deep=False):
        # One pass with a set: a mapping of n keys costs n, not n² (40,000 keys once took 40 s of CPU).
        seen, duplicates = set(), set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int):
                (duplicates if key in seen else seen).add(key)
        if duplicates:
            raise yaml.YAMLError(f"duplicate keys: {', '.join(map(str, sorted(duplicates, key=str)))}")
        return super().construct_mapping(node, deep=deep)


class TooLarge(yaml.YAMLError):
    """The document is over a bound: refused as it is, not as invalid YAML."""


def _scan(text: str) -> None:
    """Walk the document's events (nothing is built) and stop at the first alias or anchor, the first node past
    BLUEPRINT_YAML_MAX_NODES or the first level past MAX_DEPTH."""
    limit, nodes, depth = settings.BLUEPRINT_YAML_MAX_NODES, 0, 0
    for event in yaml.parse(text, Loader=FastSafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.YAMLError(f"anchors and aliases are not allowed (line {event.start_mark.line + 1})")
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > limit:
                raise TooLarge(f"the document holds more than {limit} YAML nodes")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise TooLarge(f"the document nests deeper than {MAX_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse(text: str | bytes, *, field: str = "document"):
    """Any YAML a blueprint page or endpoint takes (a whole document, a version's content), read within bounds:
    at most BLUEPRINT_YAML_MAX_BYTES, BLUEPRINT_YAML_MAX_NODES and MAX_DEPTH, with no aliases, anchors, duplicate
    keys or tags beyond YAML's own. ServiceError (400, on ``field``) for anything else."""
    if isinstance(text, bytes):
        if len(text) > max_bytes():
            raise ServiceError(f"the document is over {max_bytes()} bytes", field=field)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ServiceError("the document is not UTF-8", field=field) from error
    if len(text.encode("utf-8", "surrogatepass")) > max_bytes():
        raise ServiceError(f"the document is over {max_bytes()} bytes", field=field)
    try:
        _scan(text)
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except TooLarge as error:
        raise ServiceError(str(error), field=field) from error
    except yaml.YAMLError as error:
        raise ServiceError(f"not valid YAML: {error}", field=field) from error
    except RecursionError as error:  # the pure-Python parser, where libyaml is missing
        raise ServiceError("the document nests too deeply", field=field) from error


def load(text: str | bytes) -> dict:
    """Parse and shape-check a blueprint document; ServiceError (400, naming the field) on anything off."""
    document = parse(text)
    if not isinstance(document, dict):
        raise ServiceError("the document must be a mapping", field="document")
    refuse_unknown_keys(document, TOP_KEYS, "document")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != "Blueprint":
        raise ServiceError(f"apiVersion must be {API_VERSION} and kind Blueprint", field="apiVersion")
    if not isinstance(document.get("name"), str):
        raise ServiceError("the blueprint's name is required", field="name")
    versions = document.get("versions", [])
    if not isinstance(versions, list):
        raise ServiceError("a list of versions", field="versions")
    for i, version in enumerate(versions):
        if not isinstance(version, dict):
            raise ServiceError("must be a mapping", field=f"versions[{i}]")
        refuse_unknown_keys(version, VERSION_KEYS, f"versions[{i}]")
        number = version.get("number")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ServiceError("a version number (1, 2, 3...)", field=f"versions[{i}].number")
        if version.get("state", "draft") not in ("draft", "active", "disabled"):
            raise ServiceError("draft, active or disabled", field=f"versions[{i}].state")
    numbers = [v["number"] for v in versions]
    if numbers != sorted(set(numbers)):
        raise ServiceError("versions must be listed once each, in ascending order", field="versions")
    return document


def dump(blueprint) -> str:
    """The whole blueprint as a document that ``load`` accepts and ``blueprint_apply`` round-trips."""
    versions = []
    for version in blueprint.versions.select_related("parent").order_by("number"):
        versions.append(
            {
                "number": version.number,
                "state": version.state,
                "parent": version.parent.number if version.parent_id else None,
                "notes": version.notes,
                "addons": version.addons,
                "node_software": version.node_software,
                "policy": version.policy,
            }
        )
    document = {
        "apiVersion": API_VERSION,
        "kind": "Blueprint",
        "name": blueprint.name,
        "description": blueprint.description,
        "auto_rollout": blueprint.auto_rollout,
        "drift_mode": blueprint.drift_mode,
        "default_strategy": blueprint.default_strategy,
        "versions": versions,
    }
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
