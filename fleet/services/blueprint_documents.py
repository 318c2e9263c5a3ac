"""Apply a whole blueprint document (from git) in one transaction: all of it, or nothing."""

from django.db import transaction

from controlplane.errors import ServiceError
from fleet.choices import VersionState
from fleet.models import Blueprint
from fleet.services.blueprints import (
    blueprint_create,
    blueprint_update,
    version_activate,
    version_create,
    version_disable,
    version_update,
)
from fleet.services.rollouts import batched_events
from fleet.specs import clean_addons, clean_node_software, clean_policy

CONTENT = ("addons", "node_software", "policy", "notes")


def _content(entry: dict, i: int) -> dict:
    return {
        "addons": clean_addons(entry.get("addons") or [], field=f"versions[{i}].addons"),
        "node_software": clean_node_software(
            entry.get("node_software") or {}, field=f"versions[{i}].node_software"
        ),
        "policy": clean_policy(entry.get("policy") or {}, field=f"versions[{i}].policy"),
        "notes": entry.get("notes") or "",
    }


@transaction.atomic
@batched_events
def blueprint_apply(*, actor, document: dict, expect_name: str | None = None) -> tuple[Blueprint, list[str]]:
    """Create or update the blueprint the document describes. Drafts are changed freely; an active or disabled
    version must match the document exactly (immutable) though it may move draft → active → disabled. New numbers
    are created in order. Versions the document leaves out are kept. Returns (blueprint, what was done)."""
    name = document["name"]
    if expect_name is not None and name != expect_name:
        raise ServiceError(f"the document describes {name}, not {expect_name}", field="name")
    meta = {
        key: document[key]
        for key in ("description", "auto_rollout", "drift_mode", "default_strategy")
        if key in document
    }
    blueprint = Blueprint.objects.filter(name=name).first()
    done = []
    if blueprint is None:
        blueprint = blueprint_create(actor=actor, name=name, **meta)
        done.append(f"created blueprint {name}")
    elif meta:
        blueprint_update(actor=actor, blueprint=blueprint, **meta)
    existing = {v.number: v for v in blueprint.versions.all()}
    for i, entry in enumerate(document.get("versions", [])):
        number, state = entry["number"], entry.get("state", VersionState.DRAFT)
        content = _content(entry, i)
        version = existing.get(number)
        if version is None:
            expected = max(existing, default=0) + 1
            if number != expected:
                raise ServiceError(f"the next version of {name} is {expected}", field=f"versions[{i}].number")
            version = version_create(actor=actor, blueprint=blueprint, parent=entry.get("parent"), **content)
            existing[number] = version
            done.append(f"created version {number}")
        elif version.state == VersionState.DRAFT:
            version = version_update(actor=actor, version=version, **content)
            done.append(f"updated draft {number}")
        else:
            changed = [key for key in CONTENT if getattr(version, key) != content[key]]
            parent = version.parent.number if version.parent_id else None
            if entry.get("parent") != parent:
                changed.append("parent")
            if changed:
                raise ServiceError(
                    f"version {number} is {version.state} and immutable; add a new version instead",
                    field=f"versions[{i}].{changed[0]}",
                )
        if state == VersionState.ACTIVE and version.state == VersionState.DRAFT:
            version_activate(actor=actor, version=version)
            done.append(f"activated version {number}")
        elif state == VersionState.DISABLED and version.state != VersionState.DISABLED:
            if version.state == VersionState.DRAFT:
                version_activate(actor=actor, version=version)
            version_disable(actor=actor, version=version)
            done.append(f"disabled version {number}")
        elif state == VersionState.DRAFT and version.state != VersionState.DRAFT:
            raise ServiceError(
                f"version {number} is {version.state}; it cannot go back to draft",
                field=f"versions[{i}].state",
            )
    return blueprint, done
