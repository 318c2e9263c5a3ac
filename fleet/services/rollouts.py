"""Rollouts: start, pause, resume, cancel and roll back. The step that moves a running rollout is in
fleet/services/rollout_steps.py; the beat-driven task calls it."""

import math
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from controlplane.queueing import queue
from fleet.choices import RolloutClusterStatus, RolloutState, VersionState
from fleet.labels import with_labels
from fleet.models import BlueprintVersion, Cluster, Fleet, Rollout, RolloutBatch, RolloutCluster
from fleet.models.rollouts import DONE_CLUSTER_STATES
from fleet.services.applying import apply_version
from fleet.services.publishing import batched, publish
from fleet.specs import clean_strategy


def batched_events(function):
    """Run the service with its events written in global topic order at the end (see publishing.batched)."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with batched():
            return function(*args, **kwargs)

    return wrapper


def rollout_url(rollout: Rollout) -> str:
    return f"/api/v1/rollouts/{rollout.pk}/"


def _target_clusters(version: BlueprintVersion, targets) -> list[dict]:
    """The clusters a target names, as dicts of the few fields a start needs (one query)."""
    if not isinstance(targets, dict) or len(targets) != 1:
        raise ServiceError("exactly one of fleet, labels, clusters or tracking", field="targets")
    ((kind, value),) = targets.items()
    fields = ("id", "name", "blueprint_id", "blueprint_version_id", "track_latest")
    clusters = Cluster.objects.all()
    if kind == "clusters":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int | str) and not isinstance(v, bool) for v in value)
        ):
            raise ServiceError("a non-empty list of cluster ids or names", field="targets.clusters")
        ids = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
        names = [v for v in value if isinstance(v, str)]
        found = list(clusters.filter(pk__in=ids).values(*fields)) + list(
            clusters.filter(name__in=names).values(*fields)
        )
        known = {c["id"] for c in found} | {c["name"] for c in found}
        missing = [v for v in value if v not in known]
        if missing:
            raise ServiceError(
                f"no such clusters: {', '.join(map(str, missing[:10]))}", field="targets.clusters"
            )
        return list({c["id"]: c for c in found}.values())
    # Fleet, label and tracking targets never move a cluster pinned to another version or on another blueprint.
    movable = clusters.filter(blueprint_id__in=[version.blueprint_id, None])
    if kind == "fleet":
        if not isinstance(value, int | str) or isinstance(value, bool):
            raise ServiceError("a fleet id or name", field="targets.fleet")
        fleet = Fleet.objects.filter(**({"pk": value} if isinstance(value, int) else {"name": value})).first()
        if fleet is None:
            raise ServiceError(f"no such fleet {value}", field="targets.fleet")
        chosen = movable.filter(fleet=fleet)
    elif kind == "labels":
        if not isinstance(value, dict) or not value or not all(isinstance(v, str) for v in value.values()):
            raise ServiceError("a mapping of label to value", field="targets.labels")
        chosen = with_labels(movable, value)
    elif kind == "tracking":
        if value is not True:
            raise ServiceError("true: the blueprint's tracking clusters", field="targets.tracking")
        chosen = clusters.filter(blueprint_id=version.blueprint_id, track_latest=True)
    else:
        raise ServiceError(
            f"unknown target {kind!r}; one of fleet, labels, clusters, tracking", field="targets"
        )
    found = list(chosen.values(*fields))
    return [c for c in found if c["track_latest"] or c["blueprint_version_id"] is None or kind == "tracking"]


def _batches(cluster_ids: list[int], canary_ids: list[int], strategy: dict) -> list[list[int]]:
    rest = [c for c in cluster_ids if c not in set(canary_ids)]
    size = strategy["batch_size"] or max(1, math.ceil(len(cluster_ids) * strategy["batch_percent"] / 100))
    waves = [canary_ids] if canary_ids else []
    return waves + [rest[i : i + size] for i in range(0, len(rest), size)]


def _canaries(strategy: dict, found: list[dict]) -> list[int]:
    canary = strategy["canary"]
    if isinstance(canary, int):
        return [c["id"] for c in found[:canary]]
    by_key = {c["name"]: c["id"] for c in found} | {c["id"]: c["id"] for c in found}
    missing = [c for c in canary if c not in by_key]
    if missing:
        raise ServiceError(
            f"canaries must be among the targets: {', '.join(map(str, missing))}", field="strategy.canary"
        )
    return list(dict.fromkeys(by_key[c] for c in canary))


@dataclass(frozen=True)
class RolloutPlan:
    """What a start would write: the cleaned strategy, the clusters it moves (``ready``, dicts of id, name and
    version), the ones skipped as busy (cluster id → the rollout holding it), the canaries and the batches."""

    strategy: dict
    ready: list[dict]
    busy: dict[int, int]
    canary_ids: list[int]
    waves: list[list[int]]

    def batches(self) -> list[list[dict]]:
        """The batches as lists of cluster dicts, in the order the rollout takes them."""
        by_id = {c["id"]: c for c in self.ready}
        return [[by_id[cid] for cid in wave] for wave in self.waves]


def rollout_plan(
    *, version: BlueprintVersion, targets: dict, strategy: dict | None = None, skip_busy: bool = False
) -> RolloutPlan:
    """The clusters and batches a rollout of ``version`` to ``targets`` would touch, refused exactly as
    ``rollout_start`` refuses (400 naming the field); writes nothing, so a page can preview a start."""
    if version.state != VersionState.ACTIVE:
        raise ServiceError(
            f"version {version.number} is {version.state}; only an active version rolls out", field="version"
        )
    strategy = clean_strategy(strategy)
    found = sorted(_target_clusters(version, targets), key=lambda c: c["name"])
    if not found:
        raise ServiceError("the targets match no cluster", field="targets")
    busy = dict(
        RolloutCluster.objects.filter(open=True, cluster_id__in=[c["id"] for c in found]).values_list(
            "cluster_id", "rollout_id"
        )
    )
    if busy and not skip_busy:
        names = [c["name"] for c in found if c["id"] in busy][:10]
        raise ServiceError(f"already in an unfinished rollout: {', '.join(names)}", field="targets")
    ready = [c for c in found if c["id"] not in busy]
    if not ready:
        raise ServiceError("every targeted cluster is already in an unfinished rollout", field="targets")
    canary_ids = _canaries(strategy, ready)
    waves = _batches([c["id"] for c in ready], canary_ids, strategy)
    return RolloutPlan(strategy=strategy, ready=ready, busy=busy, canary_ids=canary_ids, waves=waves)


def _new_rollout(*, actor, version: BlueprintVersion, targets: dict, plan: RolloutPlan) -> Rollout:
    """The rollout row for a start: the version, the targets and the plan's strategy and canaries."""
    strategy = plan.strategy
    return Rollout.objects.create(
        version=version,
        targets=targets,
        canary=plan.canary_ids,
        batch_size=strategy["batch_size"],
        batch_percent=strategy["batch_percent"],
        max_failures=strategy["max_failures"],
        progress_deadline_seconds=strategy["progress_deadline_seconds"],
        soak_seconds=strategy["soak_seconds"],
        change_window=strategy["change_window"],
        auto_rollback=strategy["auto_rollback"],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )


def _rollout_cluster_rows(rollout: Rollout, plan: RolloutPlan) -> list[RolloutCluster]:
    """One unsaved row per cluster the rollout moves, in its batch and with the version it had, then one Skipped
    row per busy cluster (in the last batch), naming the rollout that holds it."""
    waves = plan.waves
    by_id = {c["id"]: c for c in plan.ready}
    rows = [
        RolloutCluster(
            rollout=rollout,
            cluster_id=cid,
            batch_index=i,
            previous_version_id=by_id[cid]["blueprint_version_id"],
            previous_track_latest=by_id[cid]["track_latest"],
        )
        for i, wave in enumerate(waves)
        for cid in wave
    ]
    rows += [
        RolloutCluster(
            rollout=rollout,
            cluster_id=cid,
            batch_index=len(waves) - 1,
            open=False,
            status=RolloutClusterStatus.SKIPPED,
            reason=f"already in rollout #{other}",
        )
        for cid, other in plan.busy.items()
    ]
    return rows


@transaction.atomic
@batched_events
def rollout_start(
    *, actor, version: BlueprintVersion, targets: dict, strategy: dict | None = None, skip_busy: bool = False
) -> Rollout:
    """Write a rollout, its batches and one row per cluster; the beat-driven step starts the first batch.

    Refused with 400 naming the field: a version that is not active, targets matching no cluster, a cluster
    already in an unfinished rollout (unless ``skip_busy``: such clusters are recorded as Skipped).
    """
    version = BlueprintVersion.objects.select_related("blueprint").get(pk=version.pk)
    plan = rollout_plan(version=version, targets=targets, strategy=strategy, skip_busy=skip_busy)
    strategy, ready, canary_ids, waves = plan.strategy, plan.ready, plan.canary_ids, plan.waves
    rollout = _new_rollout(actor=actor, version=version, targets=targets, plan=plan)
    RolloutBatch.objects.bulk_create(
        [
            RolloutBatch(rollout=rollout, index=i, canary=bool(canary_ids) and i == 0)
            for i in range(len(waves))
        ]
    )
    rows = _rollout_cluster_rows(rollout, plan)
    try:
        with transaction.atomic():
            RolloutCluster.objects.bulk_create(rows, batch_size=5000)
    except IntegrityError as error:  # a concurrent start took one of these clusters first
        raise ServiceError("a targeted cluster was just put into another rollout", field="targets") from error
    audit_record(
        actor=actor,
        action="rollout.start",
        target=rollout,
        changes={
            "version": str(version),
            "targets": targets,
            "strategy": strategy,
            "clusters": len(ready),
            "batches": len(waves),
        },
    )
    publish(
        "rollout.created",
        {
            "rollout": rollout.pk,
            "version": str(version),
            "clusters": len(ready),
            "batches": len(waves),
            "state": rollout.state,
        },
        rollout_url(rollout),
        rollout=rollout.pk,
    )
    _queue_step(rollout.pk)
    return rollout


def _queue_step(rollout_id: int) -> None:
    from fleet.tasks import rollout_progress_task

    transaction.on_commit(lambda: queue(rollout_progress_task, rollout_id))


def release_drained_nodes(row: RolloutCluster) -> None:
    """Return to service the nodes a rollout was draining for a cluster it will not finish (best effort)."""
    from fleet.models import Node
    from fleet.services.nodes import node_uncordon

    for node in Node.objects.filter(pk__in=row.nodes_draining or []):
        try:
            node_uncordon(
                actor=None, node=node, reason=f"rollout #{row.rollout_id} stopped before updating it"
            )
        except ServiceError:
            continue
    if row.nodes_draining:
        row.nodes_draining = []
        row.save(update_fields=["nodes_draining"])


def _release_open_drains(rollout: Rollout) -> None:
    for row in rollout.clusters.exclude(nodes_draining=[]):
        release_drained_nodes(row)


def _locked(rollout: Rollout) -> Rollout:
    return (
        Rollout.objects.select_for_update(of=("self",))
        .select_related("version__blueprint")
        .get(pk=rollout.pk)
    )


def _move(rollout: Rollout, state: str, *, actor, reason: str, action: str) -> Rollout:
    if not rollout.may_become(state):
        raise ServiceError(
            f"rollout #{rollout.pk} is {rollout.state}; it cannot become {state}", field="state", status=409
        )
    old = rollout.state
    rollout.state = state
    rollout.reason = (reason or rollout.reason)[:500]
    if state in (
        RolloutState.SUCCEEDED,
        RolloutState.FAILED,
        RolloutState.CANCELLED,
        RolloutState.ROLLED_BACK,
    ):
        rollout.finished_at = rollout.finished_at or timezone.now()
        rollout.clusters.filter(open=True).update(open=False)
        rollout.batches.filter(
            status__in=[
                RolloutBatch.Status.PROGRESSING,
                RolloutBatch.Status.SOAKING,
                RolloutBatch.Status.WAITING,
            ]
        ).update(status=RolloutBatch.Status.STOPPED, finished_at=rollout.finished_at)
    rollout.save(update_fields=["state", "reason", "finished_at"])
    audit_record(
        actor=actor, action=action, target=rollout, changes={"state": [old, state], "reason": reason}
    )
    publish(
        f"rollout.{state.lower()}",
        {"rollout": rollout.pk, "state": state, "previous": old, "reason": reason},
        rollout_url(rollout),
        rollout=rollout.pk,
    )
    return rollout


@transaction.atomic
@batched_events
def rollout_pause(*, actor, rollout: Rollout, reason: str = "") -> Rollout:
    """Stop taking steps; clusters already applied stay as they are."""
    rollout = _locked(rollout)
    if rollout.state == RolloutState.PAUSED:
        return rollout
    return _move(
        rollout,
        RolloutState.PAUSED,
        actor=actor,
        reason=reason or "paused by an operator",
        action="rollout.pause",
    )


@transaction.atomic
@batched_events
def rollout_resume(*, actor, rollout: Rollout) -> Rollout:
    """Take steps again; the clusters in flight get a fresh progress deadline and the soak starts over."""
    rollout = _locked(rollout)
    if rollout.state == RolloutState.RUNNING:
        return rollout
    now = timezone.now()
    deadline = now + timezone.timedelta(seconds=rollout.progress_deadline_seconds)
    rollout.clusters.filter(batch_index=rollout.current_batch).exclude(status__in=DONE_CLUSTER_STATES).update(
        deadline_at=deadline
    )
    RolloutBatch.objects.filter(
        rollout=rollout, index=rollout.current_batch, status=RolloutBatch.Status.SOAKING
    ).update(soak_until=now + timezone.timedelta(seconds=rollout.soak_seconds))
    rollout = _move(rollout, RolloutState.RUNNING, actor=actor, reason="resumed", action="rollout.resume")
    _queue_step(rollout.pk)
    return rollout


@transaction.atomic
@batched_events
def rollout_cancel(*, actor, rollout: Rollout, reason: str = "") -> Rollout:
    """Stop for good: clusters not yet applied are Skipped; applied clusters keep the new version."""
    rollout = _locked(rollout)
    if rollout.state == RolloutState.CANCELLED:
        return rollout
    _release_open_drains(rollout)
    rollout.clusters.filter(status=RolloutClusterStatus.TO_APPLY).update(
        status=RolloutClusterStatus.SKIPPED, reason="rollout cancelled", finished_at=timezone.now()
    )
    return _move(
        rollout,
        RolloutState.CANCELLED,
        actor=actor,
        reason=reason or "cancelled by an operator",
        action="rollout.cancel",
    )


@transaction.atomic
@batched_events
def rollout_rollback(*, actor, rollout: Rollout, reason: str = "") -> Rollout:
    """Every cluster the rollout touched returns to its previous version and is pinned there with the reason
    (a tracking cluster stays pinned until an operator lets it track again). Untouched clusters are Skipped."""
    rollout = _locked(rollout)
    if rollout.state == RolloutState.ROLLED_BACK:
        return rollout
    return roll_back_locked(rollout, actor=actor, reason=reason or "rolled back by an operator")


def roll_back_locked(rollout: Rollout, *, actor, reason: str) -> Rollout:
    """The rollback itself, for a rollout row the caller has locked (the step calls it on a spent budget)."""
    if not rollout.may_become(RolloutState.ROLLED_BACK):
        raise ServiceError(
            f"rollout #{rollout.pk} is {rollout.state}; it cannot be rolled back", field="state", status=409
        )
    now = timezone.now()
    version = rollout.version
    _release_open_drains(rollout)
    rows = list(
        rollout.clusters.filter(applied_at__isnull=False, rolled_back_at__isnull=True).select_related(
            "cluster", "previous_version"
        )
    )
    failures = {}
    for row in rows:
        cluster = Cluster.objects.select_for_update().get(pk=row.cluster_id)
        pinned = f"rolled back from {version} by rollout #{rollout.pk}: {reason}"[:300]
        previous = row.previous_version
        old_software = previous.effective_node_software() if previous else {}
        revert_nodes = version.effective_node_software() != old_software and cluster.nodes.exists()
        try:
            # Add-ons go back at once; node software goes back node by node, drained within the budget, on the
            # next steps (rollout_steps.revert_step), as the forward change came.
            apply_version(cluster=cluster, version=previous, previous=version, node_software=not revert_nodes)
        except Exception as error:  # noqa: BLE001 - a driver failure must not stop the others from going back
            failures[cluster.name] = str(error)[:200]
        if revert_nodes:
            row.reverting, row.nodes_updated, row.nodes_draining = True, [], []
            row.save(update_fields=["reverting", "nodes_updated", "nodes_draining"])
        cluster.blueprint_version = previous
        cluster.track_latest = False
        cluster.pinned_reason = pinned
        cluster.save(update_fields=["blueprint_version", "track_latest", "pinned_reason"])
        row.rolled_back_at = now
        row.reason = (f"{row.reason}; " if row.reason else "") + f"rolled back: {reason}"
        row.reason = row.reason[:500]
        row.save(update_fields=["rolled_back_at", "reason"])
        audit_record(
            actor=actor,
            action="cluster.rollback",
            target=cluster,
            tenant_id=cluster.dedicated_tenant_id,
            changes={
                "blueprint_version": [str(version), str(previous) if previous else None],
                "track_latest": [row.previous_track_latest, False],
                "reason": reason,
            },
        )
        publish(
            "cluster.rolled_back",
            {
                "rollout": rollout.pk,
                "cluster": cluster.pk,
                "name": cluster.name,
                "version": previous.number if previous else None,
                "reason": reason,
            },
            f"/api/v1/clusters/{cluster.pk}/",
            clusters=[cluster.pk],
            rollout=rollout.pk,
        )
    rollout.clusters.filter(status=RolloutClusterStatus.TO_APPLY).update(
        status=RolloutClusterStatus.SKIPPED, reason="rollout rolled back", finished_at=now
    )
    if failures:
        reason = f"{reason} (could not reach: {', '.join(sorted(failures))})"
    return _move(rollout, RolloutState.ROLLED_BACK, actor=actor, reason=reason, action="rollout.rollback")
