"""Fleets and clusters: create, change, delete; a cluster's blueprint assignment; reconcile on demand."""

from django.db import IntegrityError, transaction

from controlplane.access import principal, require
from controlplane.audit import audit_record, field_changes
from controlplane.errors import ServiceError
from controlplane.queueing import queue
from fleet.choices import VersionState
from fleet.desired import compare, load_versions
from fleet.drivers import DriverError
from fleet.models import Blueprint, Cluster, Fleet, RolloutCluster
from fleet.overlays import cluster_desired
from fleet.services.applying import apply_version, converge
from fleet.services.blueprints import latest_active
from fleet.services.observation import observe, record
from fleet.services.publishing import publish
from fleet.specs import clean_strategy

FLEET_FIELDS = (
    "name",
    "description",
    "automation",
    "max_cordoned_nodes",
    "max_draining_nodes",
    "max_disrupted_percent",
)
CLUSTER_FIELDS = (
    "fleet",
    "name",
    "dedicated_tenant",
    "region",
    "tier",
    "labels",
    "kind",
    "driver",
    "connection",
    "restart_overhead_minutes",
    "automation",
    "max_concurrent_migrations",
    "max_migrations_per_leaf",
)


def _cluster_url(cluster: Cluster) -> str:
    return f"/api/v1/clusters/{cluster.pk}/"


def _save_unique(instance, field: str, **kwargs):
    try:
        with transaction.atomic():
            instance.full_clean(validate_unique=False, validate_constraints=False)
            instance.save(**kwargs)
    except IntegrityError as error:
        raise ServiceError(f"that {field} is taken", field=field) from error


@transaction.atomic
def fleet_create(*, actor, **fields) -> Fleet:
    fleet = Fleet(**{k: v for k, v in fields.items() if k in FLEET_FIELDS})
    _save_unique(fleet, "name")
    audit_record(actor=actor, action="fleet.create", target=fleet, changes={"name": fleet.name})
    publish("fleet.created", {"fleet": fleet.pk, "name": fleet.name}, f"/api/v1/fleets/{fleet.pk}/")
    return fleet


@transaction.atomic
def fleet_update(*, actor, fleet: Fleet, **fields) -> Fleet:
    fleet = Fleet.objects.select_for_update().get(pk=fleet.pk)
    fields = {k: v for k, v in fields.items() if k in FLEET_FIELDS}
    changes = field_changes(fleet, fields)
    for key, value in fields.items():
        setattr(fleet, key, value)
    _save_unique(fleet, "name")
    if changes:
        audit_record(actor=actor, action="fleet.update", target=fleet, changes=changes)
        publish(
            "fleet.updated",
            {"fleet": fleet.pk, "name": fleet.name, "fields": sorted(changes)},
            f"/api/v1/fleets/{fleet.pk}/",
        )
    return fleet


@transaction.atomic
def fleet_delete(*, actor, fleet: Fleet) -> None:
    if fleet.clusters.exists():
        raise ServiceError("the fleet still has clusters", status=409)
    audit_record(actor=actor, action="fleet.delete", target=fleet)
    publish("fleet.deleted", {"fleet": fleet.pk, "name": fleet.name}, f"/api/v1/fleets/{fleet.pk}/")
    fleet.delete()


def _check_credentials(actor, fields: dict) -> None:
    # No actor (a command, a task) is the system itself.
    require(
        "connection" not in fields
        or principal(actor).is_provider_admin
        or not getattr(actor, "is_authenticated", False),
        "only the provider admin may set cluster credentials",
        field="connection",
    )
    if "connection" in fields and not isinstance(fields["connection"], dict):
        raise ServiceError("must be a mapping", field="connection")
    if "labels" in fields and (
        not isinstance(fields["labels"], dict)
        or not all(isinstance(v, str) for v in fields["labels"].values())
    ):
        raise ServiceError("a mapping of label to string value", field="labels")


@transaction.atomic
def cluster_create(*, actor, **fields) -> Cluster:
    fields = {k: v for k, v in fields.items() if k in CLUSTER_FIELDS}
    _check_credentials(actor, fields)
    cluster = Cluster(**fields)
    _save_unique(cluster, "name")
    audit_record(
        actor=actor,
        action="cluster.create",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={k: str(v) for k, v in fields.items() if k != "connection"},
    )
    publish(
        "cluster.created",
        {"cluster": cluster.pk, "name": cluster.name},
        _cluster_url(cluster),
        clusters=[cluster.pk],
    )
    return cluster


@transaction.atomic
def cluster_update(*, actor, cluster: Cluster, **fields) -> Cluster:
    """Change a cluster's settings; credentials (``connection``) only by the provider admin, never echoed."""
    fields = {k: v for k, v in fields.items() if k in CLUSTER_FIELDS}
    _check_credentials(actor, fields)
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    changes = field_changes(cluster, fields)
    if "connection" in changes:
        changes["connection"] = "changed"  # credentials stay out of the audit trail
    for key, value in fields.items():
        setattr(cluster, key, value)
    _save_unique(cluster, "name")
    if changes:
        audit_record(
            actor=actor,
            action="cluster.update",
            target=cluster,
            tenant_id=cluster.dedicated_tenant_id,
            changes=changes,
        )
        publish(
            "cluster.updated",
            {"cluster": cluster.pk, "name": cluster.name, "fields": sorted(changes)},
            _cluster_url(cluster),
            clusters=[cluster.pk],
        )
    return cluster


@transaction.atomic
def cluster_delete(*, actor, cluster: Cluster) -> None:
    if RolloutCluster.objects.filter(cluster=cluster, open=True).exists():
        raise ServiceError("the cluster is in an unfinished rollout", status=409)
    audit_record(actor=actor, action="cluster.delete", target=cluster, tenant_id=cluster.dedicated_tenant_id)
    publish(
        "cluster.deleted",
        {"cluster": cluster.pk, "name": cluster.name},
        _cluster_url(cluster),
        clusters=[cluster.pk],
    )
    cluster.delete()


@transaction.atomic
def cluster_assign(
    *,
    actor,
    cluster: Cluster,
    blueprint: Blueprint,
    version: int | None = None,
    track_latest: bool = False,
    reason: str = "",
) -> Cluster:
    """Pin the cluster to an active version of ``blueprint``, or let it track the blueprint's latest active
    version (which also clears a rollback's pin). A pin takes effect at once: the cluster is reconciled to it after
    commit. Tracking never moves a cluster at once: when the latest version is not the one it carries, a rollout
    of that version to this cluster starts (the blueprint's default strategy: its soak, gate and deadlines), and
    the cluster keeps its version until the rollout applies the new one."""
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if RolloutCluster.objects.filter(cluster=cluster, open=True).exists():
        raise ServiceError(
            "the cluster is in an unfinished rollout; wait for it or cancel it", field="cluster", status=409
        )
    if track_latest == (version is not None):
        raise ServiceError("give a version to pin, or track_latest: true", field="version")
    if track_latest:
        target = latest_active(blueprint)
        if target is None:
            raise ServiceError(f"blueprint {blueprint.name} has no active version", field="track_latest")
    else:
        target = blueprint.versions.filter(number=version).first()
        if target is None:
            raise ServiceError(f"blueprint {blueprint.name} has no version {version}", field="version")
        if target.state == VersionState.DRAFT or (
            target.state == VersionState.DISABLED and cluster.blueprint_version_id != target.pk
        ):
            raise ServiceError(
                f"version {version} is {target.state}; only active versions can be assigned", field="version"
            )
    previous = cluster.blueprint_version
    if track_latest and previous != target:
        _track_by_rollout(actor=actor, cluster=cluster, blueprint=blueprint, target=target)
        return cluster
    before = {
        "blueprint_version": str(previous) if previous else None,
        "track_latest": cluster.track_latest,
        "pinned_reason": cluster.pinned_reason,
    }
    cluster.blueprint, cluster.blueprint_version, cluster.track_latest = blueprint, target, track_latest
    cluster.pinned_reason = "" if track_latest else (reason or "pinned by an operator")[:300]
    cluster.save(update_fields=["blueprint", "blueprint_version", "track_latest", "pinned_reason"])
    audit_record(
        actor=actor,
        action="cluster.assign",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={
            "before": before,
            "after": {
                "blueprint_version": str(target),
                "track_latest": track_latest,
                "pinned_reason": cluster.pinned_reason,
            },
        },
    )
    publish(
        "cluster.assigned",
        {
            "cluster": cluster.pk,
            "name": cluster.name,
            "blueprint": blueprint.name,
            "version": target.number,
            "track_latest": track_latest,
        },
        _cluster_url(cluster),
        clusters=[cluster.pk],
    )
    if previous != target:
        from fleet.tasks import cluster_reconcile_task

        transaction.on_commit(lambda: queue(cluster_reconcile_task, cluster.pk))
    return cluster


def tracking_strategy(*, blueprint: Blueprint, cluster: Cluster) -> dict:
    """The strategy a rollout started by tracking uses (cleaned, defaults filled in): the blueprint's default, with
    canaries named there kept only when they name this cluster (a one-cluster rollout has no other)."""
    strategy = dict(blueprint.default_strategy or {})
    if isinstance(strategy.get("canary"), list):
        strategy["canary"] = [c for c in strategy["canary"] if c in (cluster.pk, cluster.name)]
    return clean_strategy(strategy)


def _as_given(strategy: dict) -> dict:
    """A cleaned strategy in the form ``clean_strategy`` takes (a zero batch size means "by percentage")."""
    given = dict(strategy)
    if not given["batch_size"]:
        given.pop("batch_size")
    return given


def _track_by_rollout(*, actor, cluster: Cluster, blueprint: Blueprint, target) -> None:
    """Let ``cluster`` (locked) track ``blueprint`` and start the rollout that moves it to ``target``."""
    from fleet.services.rollouts import rollout_start

    rollout = rollout_start(
        actor=actor,
        version=target,
        targets={"clusters": [cluster.pk]},
        strategy=_as_given(tracking_strategy(blueprint=blueprint, cluster=cluster)),
    )
    before = {"track_latest": cluster.track_latest, "pinned_reason": cluster.pinned_reason}
    cluster.blueprint, cluster.track_latest, cluster.pinned_reason = blueprint, True, ""
    cluster.save(update_fields=["blueprint", "track_latest", "pinned_reason"])
    audit_record(
        actor=actor,
        action="cluster.assign",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={
            "before": before,
            "after": {"track_latest": True, "pinned_reason": ""},
            "rollout": rollout.pk,
            "to": str(target),
        },
    )
    publish(
        "cluster.assigned",
        {
            "cluster": cluster.pk,
            "name": cluster.name,
            "blueprint": blueprint.name,
            "version": cluster.blueprint_version.number if cluster.blueprint_version_id else None,
            "track_latest": True,
            "rollout": rollout.pk,
        },
        _cluster_url(cluster),
        clusters=[cluster.pk],
    )


@transaction.atomic
def cluster_reconcile(*, actor, cluster: Cluster) -> dict:
    """Observe the cluster now and re-apply whatever of its desired add-ons differs (node software excepted:
    that needs a drain, which a rollout does). Returns {"corrected": [...], "failed": {...}, "in_sync": bool}."""
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    if cluster.blueprint_version_id is None:
        raise ServiceError("the cluster carries no blueprint version", field="cluster", status=409)
    version = load_versions([cluster.blueprint_version_id])[cluster.blueprint_version_id]
    observed, errors = observe([cluster])
    if cluster.pk in errors:
        raise ServiceError(f"the cluster cannot be observed: {errors[cluster.pk]}", status=503)
    checks = compare(cluster_desired(cluster, version), observed[cluster.pk])
    if not observed[cluster.pk]:
        try:  # nothing there yet: put the whole version on
            done, failed = apply_version(cluster=cluster, version=version, previous=None), {}
        except DriverError as error:
            done, failed = [], {"*": str(error)}
    else:
        done, failed = converge(cluster=cluster, checks=checks)
    from django.utils import timezone

    record({cluster.pk: checks}, {}, timezone.now())
    result = {"corrected": done, "failed": failed, "in_sync": not any(c.kind for c in checks)}
    audit_record(
        actor=actor,
        action="cluster.reconcile",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes=result,
    )
    publish(
        "cluster.reconciled",
        {"cluster": cluster.pk, "name": cluster.name, **result},
        _cluster_url(cluster),
        clusters=[cluster.pk],
    )
    return result
