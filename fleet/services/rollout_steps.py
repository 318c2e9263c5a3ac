"""One step of a running rollout: start the next batch, advance its clusters, check the health gate, stop on a
spent failure budget and roll back if asked. Level-triggered: the step reads the rows, moves one step and can run
twice (the rollout row is locked for the step; a second caller finds it locked and leaves).

Automation governs the steps: with the provider switch paused no rollout moves; a cluster whose effective
automation is paused is not changed (it waits, its progress deadline held off), and one in dry-run is recorded
with what would have been applied and skipped. The health gate while soaking: a Degraded or Missing add-on fails
the cluster; drift that is only out of sync (the add-on healthy) is reported and the batch waits for it to
converge (up to the progress deadline after the soak); at the end, the fault-rate gate (fleet/gate.py)."""

from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from fleet import hooks
from fleet.choices import AutomationMode, HealthStatus, NodeState, RolloutClusterStatus, RolloutState
from fleet.desired import compare, desired_state, is_node_software, load_versions
from fleet.drivers import DriverError, driver_for
from fleet.gate import fault_gate
from fleet.models import Cluster, Node, Rollout, RolloutBatch, RolloutCluster
from fleet.models.hardware import provider_automation
from fleet.models.rollouts import DONE_CLUSTER_STATES, FAILED_CLUSTER_STATES
from fleet.overlays import load_overlays, with_overlays
from fleet.services.applying import apply_version, apply_waiting, supports_addons
from fleet.services.observation import observe, record
from fleet.services.publishing import batched, publish
from fleet.services.rollouts import (
    _move,
    _release_open_drains,
    release_drained_nodes,
    roll_back_locked,
    rollout_url,
)
from fleet.specs import in_change_window

Status = RolloutClusterStatus
BatchStatus = RolloutBatch.Status
PROVIDER_PAUSED = "held: automation is paused provider-wide"
CLUSTER_PAUSED = "held: automation is paused on the cluster or its fleet"
# A soaking cluster fails on these; anything else not ready (out of sync, progressing, unknown) is waited for.
BROKEN_HEALTH = (HealthStatus.DEGRADED, HealthStatus.MISSING)


def rollout_step(*, rollout_id: int, now=None) -> str:
    """Move the rollout one step; returns what it did ("busy", "gone", "idle", "batch-started", ...)."""
    with transaction.atomic(), batched():
        rows = Rollout.objects.select_related("version__blueprint").filter(pk=rollout_id)
        if connection.features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True, of=("self",))
        else:
            rows = rows.select_for_update(of=("self",))
        rollout = rows.first()
        if rollout is None:
            return "busy-or-gone"
        now = now or timezone.now()
        if provider_automation() == AutomationMode.PAUSED:
            if rollout.reason != PROVIDER_PAUSED:
                rollout.reason = PROVIDER_PAUSED
                rollout.save(update_fields=["reason"])
            return "held"
        if rollout.reason == PROVIDER_PAUSED:
            rollout.reason = ""
            rollout.save(update_fields=["reason"])
        if rollout.state == RolloutState.PENDING:
            _move(rollout, RolloutState.RUNNING, actor=None, reason="started", action="rollout.run")
            rollout.started_at = now
            rollout.save(update_fields=["started_at"])
        if rollout.state == RolloutState.ROLLED_BACK:
            return revert_step(rollout, now)
        if rollout.state != RolloutState.RUNNING:
            return "idle"
        rollout.last_step_at = now
        rollout.save(update_fields=["last_step_at"])
        batch = rollout.batches.filter(index=rollout.current_batch).first()
        if batch is None or batch.status in (BatchStatus.PASSED, BatchStatus.FAILED):
            return _start_next_batch(rollout, now)
        if batch.status == BatchStatus.PROGRESSING:
            return _advance(rollout, batch, now)
        if batch.status == BatchStatus.SOAKING:
            return _soak(rollout, batch, now)
        return "idle"


def _start_next_batch(rollout: Rollout, now) -> str:
    batch = rollout.batches.filter(index__gt=rollout.current_batch).order_by("index").first()
    if batch is None:
        _move(
            rollout,
            RolloutState.SUCCEEDED,
            actor=None,
            reason="every batch passed its health gate",
            action="rollout.succeed",
        )
        return "succeeded"
    if not in_change_window(rollout.change_window, now):
        if rollout.reason != "waiting for the change window":
            rollout.reason = "waiting for the change window"
            rollout.save(update_fields=["reason"])
        return "outside-change-window"
    rollout.current_batch = batch.index
    rollout.reason = ""
    rollout.save(update_fields=["current_batch", "reason"])
    batch.status, batch.started_at = BatchStatus.PROGRESSING, now
    batch.save(update_fields=["status", "started_at"])
    rollout.clusters.filter(batch_index=batch.index, status=Status.TO_APPLY).update(
        deadline_at=now + timedelta(seconds=rollout.progress_deadline_seconds)
    )
    publish(
        "rollout.batch_started",
        {"rollout": rollout.pk, "batch": batch.index, "canary": batch.canary},
        rollout_url(rollout),
        rollout=rollout.pk,
    )
    _advance(rollout, batch, now)
    return "batch-started"


def _finish(row: RolloutCluster, status: str, reason: str, now) -> None:
    if status != Status.SUCCEEDED:
        release_drained_nodes(row)
    row.status, row.reason, row.finished_at = status, reason[:500], now
    row.save(update_fields=["status", "reason", "finished_at", "healthy_at"])
    publish(
        "rollout.cluster",
        {
            "rollout": row.rollout_id,
            "cluster": row.cluster_id,
            "batch": row.batch_index,
            "status": status,
            "reason": reason[:200],
        },
        rollout_url(row.rollout),
        clusters=[row.cluster_id],
        rollout=row.rollout_id,
    )


def _advance(rollout: Rollout, batch: RolloutBatch, now) -> str:
    """Apply the batch's waiting clusters, then observe the ones in flight."""
    rows = list(
        rollout.clusters.filter(batch_index=batch.index)
        .exclude(status__in=DONE_CLUSTER_STATES)
        .select_related("cluster__fleet", "previous_version")
        .order_by("cluster_id")
    )
    for row in rows:
        row.rollout = rollout
        if row.status == Status.TO_APPLY:
            _apply(rollout, row, now)
    in_flight = [row for row in rows if row.status == Status.PROGRESSING]
    _observe_rows(rollout, in_flight, now)
    for row in rows:
        if row.status == Status.TO_APPLY and row.deadline_at and now >= row.deadline_at:
            _finish(row, Status.TIMED_OUT, f"not applied before the progress deadline ({row.reason})", now)
    if rollout.clusters.filter(batch_index=batch.index).exclude(status__in=DONE_CLUSTER_STATES).exists():
        return "batch-progressing"
    if _budget_spent(rollout, now):
        return "stopped"
    batch.status = BatchStatus.SOAKING
    batch.soak_until = now + timedelta(seconds=rollout.soak_seconds)
    batch.save(update_fields=["status", "soak_until"])
    publish(
        "rollout.batch_soaking",
        {"rollout": rollout.pk, "batch": batch.index, "soak_until": batch.soak_until.isoformat()},
        rollout_url(rollout),
        rollout=rollout.pk,
    )
    return "batch-soaking"


def _apply(rollout: Rollout, row: RolloutCluster, now) -> None:
    """Move one cluster to the rollout's version: first node software node by node (drained within the disruption
    budget, never under a protected job that cannot move), then the add-ons. Stays ToApply while it must wait."""
    version = rollout.version
    cluster = Cluster.objects.select_for_update(of=("self",)).select_related("fleet").get(pk=row.cluster_id)
    if not supports_addons(cluster):
        _finish(row, Status.SKIPPED, f"the {cluster.driver} driver cannot apply add-ons", now)
        return
    new_software = version.effective_node_software()
    old_software = row.previous_version.effective_node_software() if row.previous_version else {}
    mode = cluster.effective_automation  # its own, its fleet's and the provider's (dry-run there too)
    if mode == AutomationMode.PAUSED:
        # Held where it stands; pausing is no failure, so the progress deadline is held off while it lasts.
        row.reason, row.deadline_at = (
            CLUSTER_PAUSED,
            now + timedelta(seconds=rollout.progress_deadline_seconds),
        )
        row.save(update_fields=["reason", "deadline_at"])
        return
    if mode == AutomationMode.DRY_RUN:
        _apply_dry_run(rollout, row, cluster, new_software, old_software, now)
        return
    if new_software != old_software and not _roll_nodes(rollout, row, cluster, now):
        return
    waiting: dict[str, str] = {}
    try:
        applied = apply_version(
            cluster=cluster, version=version, previous=row.previous_version, waiting=waiting
        )
    except DriverError as error:
        if error.transient:
            row.reason = f"waiting: {error}"[:500]
            row.save(update_fields=["reason"])
        else:
            _finish(row, Status.FAILED, f"the cluster refused: {error}", now)
        return
    _record_applied(rollout, row, cluster, applied, now, waiting=waiting)


def _waits(waiting: dict[str, str]) -> str:
    return "; ".join(f"{name} {why}" for name, why in sorted(waiting.items()))[:500]


def _apply_dry_run(
    rollout: Rollout, row: RolloutCluster, cluster: Cluster, new_software: dict, old_software: dict, now
) -> None:
    """A cluster in dry-run: audit what applying the version would have done, and skip it with nothing changed."""
    version = rollout.version
    would = {
        "blueprint_version": [str(row.previous_version) if row.previous_version else None, str(version)],
        "node_software": new_software if new_software != old_software else "unchanged",
        "nodes_to_drain": cluster.nodes.filter(state=NodeState.READY).count()
        if new_software != old_software
        else 0,
    }
    audit_record(
        actor=None,
        action="rollout.cluster_apply",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={"rollout": rollout.pk, "dry_run": True, "would": would},
    )
    _finish(
        row,
        Status.SKIPPED,
        f"dry run: would apply {version}"
        f"{' with node software ' + str(new_software) if new_software != old_software else ''}; nothing changed",
        now,
    )


def _record_applied(
    rollout: Rollout, row: RolloutCluster, cluster: Cluster, applied, now, waiting: dict | None = None
) -> None:
    """The driver applied the version: the cluster is on it and its row Progressing (observed until healthy; add-ons
    held back for their dependencies go on as those turn healthy), audited and published."""
    version = rollout.version
    cluster.blueprint = version.blueprint
    cluster.blueprint_version = version
    cluster.save(update_fields=["blueprint", "blueprint_version"])
    row.status, row.applied_at, row.reason = Status.PROGRESSING, now, _waits(waiting or {})
    row.save(update_fields=["status", "applied_at", "reason"])
    audit_record(
        actor=None,
        action="rollout.cluster_apply",
        target=cluster,
        tenant_id=cluster.dedicated_tenant_id,
        changes={
            "rollout": rollout.pk,
            "blueprint_version": [str(row.previous_version) if row.previous_version else None, str(version)],
            "applied": applied,
        },
    )
    publish(
        "rollout.cluster",
        {
            "rollout": rollout.pk,
            "cluster": cluster.pk,
            "name": cluster.name,
            "batch": row.batch_index,
            "status": row.status,
            "version": version.number,
        },
        rollout_url(rollout),
        clusters=[cluster.pk],
        rollout=rollout.pk,
    )


def revert_step(rollout: Rollout, now) -> str:
    """A rolled-back rollout's remaining work: put back the previous node software on the clusters it changed,
    node by node, drained within the previous version's budget and never under a protected job that cannot move;
    each cluster's node software is pinned back once its last node is done."""
    rows = list(
        rollout.clusters.filter(reverting=True).select_related("previous_version").order_by("cluster_id")
    )
    if not rows:
        return "idle"
    for row in rows:
        cluster = (
            Cluster.objects.select_for_update(of=("self",)).select_related("fleet").get(pk=row.cluster_id)
        )
        mode = cluster.effective_automation
        if mode != AutomationMode.ACTIVE:
            held = (
                CLUSTER_PAUSED
                if mode == AutomationMode.PAUSED
                else (
                    f"dry run: would put node software {row.previous_version} back node by node; nothing changed"
                )
            )
            if row.reason != held:
                row.reason = held[:500]
                row.save(update_fields=["reason"])
            continue
        if not _roll_nodes(rollout, row, cluster, now, target=row.previous_version):
            continue
        try:
            apply_version(cluster=cluster, version=row.previous_version, previous=rollout.version)
        except DriverError as error:
            row.reason = f"waiting: {error}"[:500]
            row.save(update_fields=["reason"])
            continue
        row.reverting, row.reason = (
            False,
            f"rolled back; node software {row.previous_version} back in place"[:500],
        )
        row.save(update_fields=["reverting", "reason"])
        audit_record(
            actor=None,
            action="rollout.cluster_revert",
            target=cluster,
            tenant_id=cluster.dedicated_tenant_id,
            changes={"rollout": rollout.pk, "node_software": str(row.previous_version)},
        )
        publish(
            "rollout.cluster",
            {
                "rollout": rollout.pk,
                "cluster": cluster.pk,
                "name": cluster.name,
                "batch": row.batch_index,
                "status": "reverted",
                "version": row.previous_version.number if row.previous_version else None,
            },
            rollout_url(rollout),
            clusters=[cluster.pk],
            rollout=rollout.pk,
        )
    return "reverting"


def _roll_nodes(rollout: Rollout, row: RolloutCluster, cluster: Cluster, now, target=None) -> bool:
    """Update node software node by node: at most ``max_unavailable_nodes`` drained at once, never a node under a
    protected job that cannot move first (``hooks.may_drain``), each drain awaited across steps (the driver says when
    it is done) before the node counts as updated and returns to service. True once every node is done."""
    from fleet.services.nodes import node_drain, node_uncordon

    target = target if target is not None else rollout.version
    budget = (
        int(target.effective_policy().get("disruption", {}).get("max_unavailable_nodes", 1)) if target else 1
    )
    done, draining = set(row.nodes_updated), set(row.nodes_draining)
    driver = driver_for(cluster)
    waiting = ""
    for node in Node.objects.filter(pk__in=draining).select_related("cluster__fleet").order_by("hostname"):
        try:
            finished = driver.drain_done(node)
        except DriverError as error:
            finished, waiting = False, f"waiting: {node.hostname}: {error}"
        if not finished:
            waiting = waiting or f"waiting: draining {node.hostname}"
            continue
        try:
            node_uncordon(actor=None, node=node, reason=f"node software {target} in place")
        except ServiceError as error:
            waiting = f"waiting: {node.hostname}: {error.detail}"
            continue
        draining.discard(node.pk)
        done.add(node.pk)
    for node in Node.objects.filter(cluster=cluster).exclude(pk__in=done | draining).order_by("hostname"):
        if len(draining) >= budget:
            break
        if node.state != NodeState.READY:
            done.add(node.pk)  # cordoned, failed or spare: nothing to evict, updated as it stands
            continue
        allowed, why = hooks.may_drain(node)
        if not allowed:
            waiting = f"waiting: {node.hostname}: {why}"
            break
        try:
            node_drain(actor=None, node=node, reason=f"node software for {target} (rollout #{rollout.pk})")
        except ServiceError as error:
            waiting = f"waiting: {node.hostname}: {error.detail}"
            break
        draining.add(node.pk)
    total = Node.objects.filter(cluster=cluster).count()
    row.nodes_updated, row.nodes_draining = sorted(done), sorted(draining)
    complete = not draining and len(done) >= total
    row.reason = (
        ""
        if complete
        else (waiting or f"node software: {len(done)}/{total} nodes updated, {len(draining)} draining")[:500]
    )
    row.save(update_fields=["nodes_updated", "nodes_draining", "reason"])
    return complete


def _observe_rows(
    rollout: Rollout, rows: list[RolloutCluster], now, found: dict | None = None
) -> dict[int, bool]:
    """Observe the rows' clusters once; settle each: Succeeded when InSync and Healthy, Failed when Degraded,
    TimedOut past its deadline. Returns {cluster id: ready}; ``found`` receives each cluster's checks."""
    if not rows:
        return {}
    clusters = [row.cluster for row in rows]
    observed, errors = observe(clusters)
    version = load_versions([rollout.version_id])[rollout.version_id]
    desired, overlays = (
        desired_state(version),
        load_overlays([version.blueprint_id]).get(version.blueprint_id),
    )
    by_id = {cluster.pk: cluster for cluster in clusters}
    checks = {
        cid: compare(with_overlays(desired, by_id[cid], overlays), states) for cid, states in observed.items()
    }
    if found is not None:
        found.update(checks)
    record(checks, errors, now)
    ready = {}
    for row in rows:
        found = checks.get(row.cluster_id)
        ready[row.cluster_id] = bool(found) and all(c.ready for c in found)
        degraded = [
            c.name + (f" ({c.observed.message})" if c.observed and c.observed.message else "")
            for c in found or []
            if c.health == "Degraded" and not is_node_software(c.name)
        ]
        if row.status != Status.PROGRESSING:
            continue
        if found and not ready[row.cluster_id] and _apply_held(row, found):
            continue
        if ready[row.cluster_id]:
            row.healthy_at = now
            _finish(row, Status.SUCCEEDED, "InSync and Healthy", now)
        elif degraded:
            _finish(row, Status.FAILED, f"degraded: {', '.join(degraded)}", now)
        elif row.deadline_at and now >= row.deadline_at:
            waiting = [f"{c.name} {c.sync}/{c.health}" for c in found or [] if not c.ready]
            _finish(
                row,
                Status.TIMED_OUT,
                f"not healthy by the deadline: {', '.join(waiting[:5]) or errors.get(row.cluster_id, '')}",
                now,
            )
    return ready


def _apply_held(row: RolloutCluster, checks) -> bool:
    """Put on the row's add-ons held back for dependencies that are healthy now, and say in its reason what still
    waits (and for what). True when it applied something (the row is observed again on the next step)."""
    held = [c for c in checks if c.kind is not None and c.desired and c.desired.get("depends_on")]
    if not held:
        return False
    try:
        applied, waits = apply_waiting(cluster=row.cluster, checks=checks)
    except DriverError as error:
        applied, waits = [], {"": f"applying what waited failed: {error}"}
    reason = _waits(waits)
    if reason != row.reason:
        row.reason = reason
        row.save(update_fields=["reason"])
    return bool(applied)


def _soak(rollout: Rollout, batch: RolloutBatch, now) -> str:
    """While soaking every cluster of the batch must stay healthy: a Degraded or Missing add-on fails it, drift
    that is only out of sync is reported and waited for (up to the progress deadline after the soak). At the end
    the fault-rate gate compares the batch's hardware faults since it started with the window before."""
    rows = list(
        rollout.clusters.filter(batch_index=batch.index, status=Status.SUCCEEDED).select_related("cluster")
    )
    for row in rows:
        row.rollout = rollout
    found: dict = {}
    ready = _observe_rows(rollout, rows, now, found=found)
    drifting = []
    for row in rows:
        checks = found.get(row.cluster_id)
        if ready.get(row.cluster_id):
            if row.reason.startswith("drift while soaking"):
                row.reason = "InSync and Healthy (the drift converged)"
                row.save(update_fields=["reason"])
            continue
        broken = [
            f"{c.name} {c.health}"
            for c in checks or []
            if c.health in BROKEN_HEALTH and not is_node_software(c.name)
        ]
        if broken:
            _finish(row, Status.FAILED, f"lost health while soaking: {', '.join(broken[:5])}", now)
            continue
        drifting.append(row)
        _report_drift(rollout, batch, row, checks)
    if _budget_spent(rollout, now):
        return "stopped"
    if now < batch.soak_until:
        return "soaking"
    if drifting:
        if now < batch.soak_until + timedelta(seconds=rollout.progress_deadline_seconds):
            return "waiting-for-convergence"
        for row in drifting:
            _finish(
                row,
                Status.FAILED,
                f"drift did not converge within {rollout.progress_deadline_seconds}s after "
                f"the soak: {row.reason.removeprefix('drift while soaking: ')}",
                now,
            )
        if _budget_spent(rollout, now):
            return "stopped"
    return _gate_batch(rollout, batch, rows, ready, now)


def _report_drift(rollout: Rollout, batch: RolloutBatch, row: RolloutCluster, checks) -> None:
    """A soaking cluster out of sync but not broken: its reason names what drifts, published when it changes."""
    waiting = [
        f"{c.name} {c.sync}/{c.health}" + (f" ({c.kind})" if c.kind else "")
        for c in checks or []
        if not c.ready
    ] or ["not observed"]
    reason = f"drift while soaking: {', '.join(waiting[:5])}; the batch waits for it to converge"[:500]
    if row.reason != reason:
        row.reason = reason
        row.save(update_fields=["reason"])
        publish(
            "rollout.drift",
            {
                "rollout": rollout.pk,
                "cluster": row.cluster_id,
                "batch": batch.index,
                "reason": reason[:200],
            },
            rollout_url(rollout),
            clusters=[row.cluster_id],
            rollout=rollout.pk,
        )


def _gate_batch(
    rollout: Rollout, batch: RolloutBatch, rows: list[RolloutCluster], ready: dict[int, bool], now
) -> str:
    """The end of a soak: the fault-rate gate over the batch's ready clusters passes the batch or fails it (and
    those clusters with it)."""
    cluster_ids = [row.cluster_id for row in rows if ready.get(row.cluster_id)]
    result = fault_gate(cluster_ids, batch.started_at, now)
    batch.faults_before, batch.faults_after = result.before, result.after
    if result.failed:
        batch.gate = f"fault rate rose: {result.describe()}"[:300]
        for row in rows:
            if ready.get(row.cluster_id):
                _finish(row, Status.FAILED, batch.gate, now)
        batch.status, batch.finished_at = BatchStatus.FAILED, now
        batch.save(update_fields=["status", "finished_at", "faults_before", "faults_after", "gate"])
        if _budget_spent(rollout, now):
            return "stopped"
        return "batch-failed"
    batch.gate = f"healthy for {rollout.soak_seconds}s; {result.describe()}"[:300]
    batch.status, batch.finished_at = BatchStatus.PASSED, now
    batch.save(update_fields=["status", "finished_at", "faults_before", "faults_after", "gate"])
    publish(
        "rollout.batch_passed",
        {"rollout": rollout.pk, "batch": batch.index, "gate": batch.gate},
        rollout_url(rollout),
        rollout=rollout.pk,
    )
    return "batch-passed"


def _budget_spent(rollout: Rollout, now) -> bool:
    """More failed clusters than the budget allows: the rollout fails, and rolls back if its strategy says so."""
    failed = rollout.clusters.filter(status__in=FAILED_CLUSTER_STATES).count()
    if failed <= rollout.max_failures:
        return False
    RolloutBatch.objects.filter(rollout=rollout, index=rollout.current_batch).exclude(
        status=BatchStatus.PASSED
    ).update(status=BatchStatus.FAILED, finished_at=now)
    reason = f"{failed} clusters failed (budget {rollout.max_failures})"
    _release_open_drains(rollout)
    rollout.clusters.filter(status=Status.TO_APPLY).update(
        status=Status.SKIPPED, reason="rollout stopped", finished_at=now
    )
    _move(rollout, RolloutState.FAILED, actor=None, reason=reason, action="rollout.fail")
    if rollout.auto_rollback:
        roll_back_locked(rollout, actor=None, reason=f"automatic: {reason}")
    return True
