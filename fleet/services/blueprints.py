"""Blueprints and their versions: create (draft), change while draft, activate (immutable), disable."""

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from controlplane.audit import audit_record, field_changes
from controlplane.errors import ServiceError
from fleet.choices import DriftMode, VersionState
from fleet.models import Blueprint, BlueprintVersion, Cluster
from fleet.services.publishing import publish
from fleet.specs import (
    NAME,
    check_dependencies,
    clean_addons,
    clean_node_software,
    clean_policy,
    clean_strategy,
)

VERSION_FIELDS = ("addons", "node_software", "policy", "notes")


def _blueprint_url(blueprint: Blueprint) -> str:
    return f"/api/v1/blueprints/{blueprint.pk}/"


def _clean_blueprint_fields(fields: dict) -> dict:
    cleaned = dict(fields)
    if "name" in cleaned and (not isinstance(cleaned["name"], str) or not NAME.match(cleaned["name"])):
        raise ServiceError("lower-case letters, digits and dashes", field="name")
    if "default_strategy" in cleaned:
        clean_strategy(cleaned["default_strategy"], field="default_strategy")
        cleaned["default_strategy"] = cleaned["default_strategy"] or {}
    if "drift_mode" in cleaned and cleaned["drift_mode"] not in DriftMode.values:
        raise ServiceError(f"one of {', '.join(DriftMode.values)}", field="drift_mode")
    return cleaned


@transaction.atomic
def blueprint_create(
    *,
    actor,
    name: str,
    description: str = "",
    auto_rollout: bool = True,
    default_strategy: dict | None = None,
    drift_mode: str = DriftMode.NOTIFY,
) -> Blueprint:
    """A new, empty blueprint; versions are added with ``version_create``."""
    fields = _clean_blueprint_fields(
        {
            "name": name,
            "description": description,
            "auto_rollout": auto_rollout,
            "default_strategy": default_strategy or {},
            "drift_mode": drift_mode,
        }
    )
    if Blueprint.objects.filter(name=name).exists():
        raise ServiceError(f"a blueprint named {name} exists", field="name")
    try:
        with transaction.atomic():
            blueprint = Blueprint.objects.create(**fields)
    except IntegrityError as error:
        raise ServiceError(f"a blueprint named {name} exists", field="name") from error
    audit_record(actor=actor, action="blueprint.create", target=blueprint, changes=fields)
    publish(
        "blueprint.created", {"blueprint": blueprint.pk, "name": blueprint.name}, _blueprint_url(blueprint)
    )
    return blueprint


@transaction.atomic
def blueprint_update(*, actor, blueprint: Blueprint, **fields) -> Blueprint:
    """Change a blueprint's description, rollout defaults or drift mode (its name stays)."""
    fields = _clean_blueprint_fields(
        {
            k: v
            for k, v in fields.items()
            if k in ("description", "auto_rollout", "default_strategy", "drift_mode")
        }
    )
    blueprint = Blueprint.objects.select_for_update().get(pk=blueprint.pk)
    changes = field_changes(blueprint, fields)
    if not changes:
        return blueprint
    for key, value in fields.items():
        setattr(blueprint, key, value)
    blueprint.save(update_fields=list(fields))
    audit_record(actor=actor, action="blueprint.update", target=blueprint, changes=changes)
    publish(
        "blueprint.updated", {"blueprint": blueprint.pk, "name": blueprint.name}, _blueprint_url(blueprint)
    )
    return blueprint


def _clean_version_fields(fields: dict) -> dict:
    cleaned = {}
    if "addons" in fields:
        cleaned["addons"] = clean_addons(fields["addons"])
    if "node_software" in fields:
        cleaned["node_software"] = clean_node_software(fields["node_software"])
    if "policy" in fields:
        cleaned["policy"] = clean_policy(fields["policy"])
    if "notes" in fields:
        if not isinstance(fields["notes"], str) or len(fields["notes"]) > 5000:
            raise ServiceError("text of at most 5000 characters", field="notes")
        cleaned["notes"] = fields["notes"]
    return cleaned


@transaction.atomic
def version_create(
    *,
    actor,
    blueprint: Blueprint,
    addons=None,
    node_software=None,
    policy=None,
    notes: str = "",
    parent: int | None = None,
    activate: bool = False,
) -> BlueprintVersion:
    """A new draft numbered one above the highest; ``parent`` is the number of a version of the same blueprint
    it overrides. With ``activate`` it is activated in the same transaction."""
    fields = _clean_version_fields(
        {
            "addons": addons or [],
            "node_software": node_software or {},
            "policy": policy or {},
            "notes": notes or "",
        }
    )
    blueprint = Blueprint.objects.select_for_update().get(
        pk=blueprint.pk
    )  # numbers are handed out one at a time
    parent_version = None
    if parent is not None:
        parent_version = blueprint.versions.filter(number=parent).first()
        if parent_version is None:
            raise ServiceError(f"blueprint {blueprint.name} has no version {parent}", field="parent")
    number = (blueprint.versions.aggregate(top=Max("number"))["top"] or 0) + 1
    version = BlueprintVersion.objects.create(
        blueprint=blueprint,
        number=number,
        parent=parent_version,
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
        **fields,
    )
    audit_record(
        actor=actor,
        action="blueprint.version_create",
        target=version,
        changes={"number": number, "parent": parent, **fields},
    )
    publish(
        "blueprint.version_created",
        {"blueprint": blueprint.pk, "version": number},
        f"/api/v1/blueprints/{blueprint.pk}/versions/{number}/",
    )
    if activate:
        version = version_activate(actor=actor, version=version)
    return version


@transaction.atomic
def version_update(*, actor, version: BlueprintVersion, **fields) -> BlueprintVersion:
    """Change a draft. An active or disabled version is immutable: 400 naming the field that was to change."""
    version = BlueprintVersion.objects.select_for_update().get(pk=version.pk)
    unknown = set(fields) - set(VERSION_FIELDS)
    if unknown:
        raise ServiceError("cannot be changed", field=sorted(unknown)[0])
    if not version.is_editable:
        field = sorted(fields)[0] if fields else "state"
        raise ServiceError(
            f"version {version.number} is {version.state} and immutable; create a new version", field=field
        )
    cleaned = _clean_version_fields(fields)
    changes = field_changes(version, cleaned)
    for key, value in cleaned.items():
        setattr(version, key, value)
    version.save(update_fields=list(cleaned) or None)
    if changes:
        audit_record(actor=actor, action="blueprint.version_update", target=version, changes=changes)
        publish(
            "blueprint.version_updated",
            {"blueprint": version.blueprint_id, "version": version.number},
            f"/api/v1/blueprints/{version.blueprint_id}/versions/{version.number}/",
        )
    return version


@transaction.atomic
def version_activate(*, actor, version: BlueprintVersion) -> BlueprintVersion:
    """Make a draft immutable. Tracking clusters do not move at once: a rollout with the blueprint's default
    strategy starts (unless the blueprint waits for an operator, or no cluster tracks it)."""
    from fleet.services.rollouts import rollout_start

    version = (
        BlueprintVersion.objects.select_for_update(of=("self",))
        .select_related("blueprint", "parent")
        .get(pk=version.pk)
    )
    if version.state == VersionState.ACTIVE:
        return version
    if version.state != VersionState.DRAFT:
        raise ServiceError(
            f"version {version.number} is {version.state}; only a draft can be activated", field="state"
        )
    if version.parent_id and version.parent.state == VersionState.DRAFT:
        raise ServiceError(f"its parent, version {version.parent.number}, is still a draft", field="parent")
    if not version.effective_addons() and not version.effective_node_software():
        raise ServiceError("a version must carry at least one add-on or node-software pin", field="addons")
    check_dependencies(version.effective_addons())
    version.state = VersionState.ACTIVE
    version.activated_at = timezone.now()
    version.save(update_fields=["state", "activated_at"])
    audit_record(
        actor=actor,
        action="blueprint.version_activate",
        target=version,
        changes={"state": [VersionState.DRAFT, VersionState.ACTIVE]},
    )
    publish(
        "blueprint.version_activated",
        {"blueprint": version.blueprint_id, "version": version.number},
        f"/api/v1/blueprints/{version.blueprint_id}/versions/{version.number}/",
    )
    blueprint = version.blueprint
    tracking = Cluster.objects.filter(blueprint=blueprint, track_latest=True).exclude(
        blueprint_version=version
    )
    if blueprint.auto_rollout and tracking.exists():
        try:
            rollout_start(
                actor=actor,
                version=version,
                targets={"tracking": True},
                strategy=blueprint.default_strategy,
                skip_busy=True,
            )
        except ServiceError as error:  # e.g. every tracking cluster is still in an earlier rollout
            audit_record(
                actor=actor,
                action="blueprint.version_no_rollout",
                target=version,
                changes={"reason": error.detail},
            )
            publish(
                "blueprint.version_waiting",
                {"blueprint": blueprint.pk, "version": version.number, "reason": error.detail},
                f"/api/v1/blueprints/{blueprint.pk}/versions/{version.number}/",
            )
    return version


@transaction.atomic
def version_disable(*, actor, version: BlueprintVersion) -> BlueprintVersion:
    """No new assignments or rollouts of this version; clusters already on it keep it."""
    version = BlueprintVersion.objects.select_for_update().get(pk=version.pk)
    if version.state == VersionState.DISABLED:
        return version
    if version.state != VersionState.ACTIVE:
        raise ServiceError("only an active version can be disabled", field="state")
    version.state = VersionState.DISABLED
    version.disabled_at = timezone.now()
    version.save(update_fields=["state", "disabled_at"])
    audit_record(
        actor=actor,
        action="blueprint.version_disable",
        target=version,
        changes={"state": [VersionState.ACTIVE, VersionState.DISABLED]},
    )
    publish(
        "blueprint.version_disabled",
        {"blueprint": version.blueprint_id, "version": version.number},
        f"/api/v1/blueprints/{version.blueprint_id}/versions/{version.number}/",
    )
    return version


def latest_active(blueprint: Blueprint) -> BlueprintVersion | None:
    return blueprint.versions.filter(state=VersionState.ACTIVE).order_by("-number").first()
