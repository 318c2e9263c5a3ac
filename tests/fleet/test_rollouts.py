"""Rollouts: batches, health gates, the failure budget, automatic rollback, pause/resume/cancel."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.errors import ServiceError
from controlplane.models import AuditEntry, Event
from fleet import hooks
from fleet.choices import RolloutClusterStatus, RolloutState
from fleet.models import Rollout, RolloutBatch, SimulatedAddon
from fleet.services.blueprints import version_create, version_disable
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import (
    rollout_cancel,
    rollout_pause,
    rollout_resume,
    rollout_rollback,
    rollout_start,
)
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on

pytestmark = pytest.mark.django_db


def run_to_end(rollout, limit=60, now=None):
    steps = []
    for _ in range(limit):
        steps.append(rollout_step(rollout_id=rollout.pk, now=now))
        rollout.refresh_from_db()
        if rollout.state not in (RolloutState.PENDING, RolloutState.RUNNING):
            return steps
    raise AssertionError(f"rollout did not finish: {steps[-5:]}")


def test_activation_starts_a_rollout_that_moves_tracking_clusters_batch_by_batch(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor)
    tracking = clusters_on(v1, 5)
    pinned = clusters_on(v1, 1, track_latest=False)[0]
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = Rollout.objects.get(version=v2)
    assert rollout.state == RolloutState.PENDING
    assert rollout.clusters.count() == 5 and not rollout.clusters.filter(cluster=pinned).exists()
    assert list(rollout.batches.values_list("index", flat=True)) == [0, 1, 2]
    for cluster in tracking:  # nothing moved yet
        cluster.refresh_from_db()
        assert cluster.blueprint_version == v1
    steps = run_to_end(rollout)
    assert rollout.state == RolloutState.SUCCEEDED, steps
    assert set(rollout.clusters.values_list("status", flat=True)) == {RolloutClusterStatus.SUCCEEDED}
    for cluster in tracking:
        cluster.refresh_from_db()
        assert cluster.blueprint_version == v2
        assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "24.9.1"
    pinned.refresh_from_db()
    assert pinned.blueprint_version == v1
    # batches started in order, each after the previous one passed
    batches = list(rollout.batches.order_by("index"))
    assert all(b.status == RolloutBatch.Status.PASSED for b in batches)
    for earlier, later in zip(batches, batches[1:], strict=False):
        assert later.started_at >= earlier.finished_at
    assert AuditEntry.objects.filter(action="rollout.cluster_apply").count() == 5
    topics = set(Event.objects.filter(kind="rollout.cluster").values_list("topic", flat=True))
    assert "fleet" in topics and f"cluster-{tracking[0].pk}" in topics and f"rollout-{rollout.pk}" in topics


def test_a_step_is_safe_to_run_twice_and_on_a_gone_rollout(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters_on(v1, 2)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 1})
    rollout_step(rollout_id=rollout.pk)
    rollout_step(rollout_id=rollout.pk)
    assert AuditEntry.objects.filter(action="rollout.cluster_apply").count() == 1
    assert rollout_step(rollout_id=10**9) == "busy-or-gone"


def test_canary_goes_first_and_percentage_batches(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 9)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"fleet": clusters[0].fleet_id},
        strategy={"canary": [clusters[4].name], "batch_size": "50%", "soak_seconds": 0},
    )
    assert list(rollout.clusters.filter(batch_index=0).values_list("cluster_id", flat=True)) == [
        clusters[4].pk
    ]
    assert rollout.batches.count() == 3  # canary, then 5 and 3 (50% of 9, rounded up)
    assert rollout.batches.get(index=0).canary


def test_soak_time_holds_the_next_batch(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters_on(v1, 2)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 1, "soak_seconds": 300}
    )
    now = timezone.now()
    assert (
        rollout_step(rollout_id=rollout.pk, now=now) == "batch-started"
    )  # applied, healthy at once: soaking
    assert rollout.batches.get(index=0).status == RolloutBatch.Status.SOAKING
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=10)) == "soaking"
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=301)) == "batch-passed"
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=302)) == "batch-started"


def test_a_failing_canary_spends_the_budget_and_rolls_back_with_a_pinned_reason(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 4)
    clusters[0].connection = {"apply_seconds": 0, "bad_charts": ["gpu-operator-bad"]}
    clusters[0].save()
    bad = [{**a, "chart": "gpu-operator-bad"} if a["name"] == "gpu-operator" else a for a in ADDONS]
    v2 = version_create(actor=actor, blueprint=bp, addons=bad, activate=True)
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"tracking": True},
        strategy={"canary": 1, "batch_size": 2, "soak_seconds": 0, "auto_rollback": True},
    )
    run_to_end(rollout)
    assert rollout.state == RolloutState.ROLLED_BACK and "1 clusters failed" in rollout.reason
    clusters[0].refresh_from_db()
    assert clusters[0].blueprint_version == v1 and not clusters[0].track_latest
    assert "rolled back from" in clusters[0].pinned_reason
    assert SimulatedAddon.objects.get(cluster=clusters[0], name="gpu-operator").chart == "gpu-operator"
    for other in clusters[1:]:  # never touched: still tracking v1
        other.refresh_from_db()
        assert other.blueprint_version == v1 and other.track_latest
    assert rollout.clusters.filter(status=RolloutClusterStatus.SKIPPED).count() == 3


def test_progress_deadline_times_clusters_out(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    (cluster,) = clusters_on(v1, 1)
    cluster.connection = {"apply_seconds": 3600}
    cluster.save()
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"tracking": True},
        strategy={"progress_deadline_seconds": 60, "auto_rollback": False, "max_failures": 0},
    )
    now = timezone.now()
    rollout_step(rollout_id=rollout.pk, now=now)
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=30)) == "batch-progressing"
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=61)) == "stopped"
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.FAILED
    assert rollout.clusters.get().status == RolloutClusterStatus.TIMED_OUT


# The fault-rate gate is tested with the real counter on real fault rows in tests/fleet/test_rollout_gate.py.


def test_node_software_drains_within_budget_and_waits_for_protected_jobs(users):
    from fleet.choices import NodeState
    from tests.support.factories import make_node

    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False, node_software={"gpu_driver": "550.90.07"})
    (cluster,) = clusters_on(v1, 1)
    cluster.connection = {"apply_seconds": 0, "migration_pause_seconds": 0}  # drains finish by the next step
    cluster.save()
    nodes = [make_node(cluster) for _ in range(3)]
    v2 = version_create(
        actor=actor,
        blueprint=bp,
        addons=ADDONS,
        node_software={"gpu_driver": "560.35.03"},
        policy={"disruption": {"max_unavailable_nodes": 2}},
        activate=True,
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"tracking": True}, strategy={"soak_seconds": 0})
    previous = hooks._drain_guard
    hooks.register_drain_guard(lambda node: (node.pk != nodes[2].pk, "protected job j-7 cannot move yet"))
    try:
        rollout_step(rollout_id=rollout.pk)  # two nodes drained (the budget), nothing applied yet
        row = rollout.clusters.get()
        assert row.status == RolloutClusterStatus.TO_APPLY and row.nodes_updated == []
        assert sorted(row.nodes_draining) == sorted([nodes[0].pk, nodes[1].pk])
        assert sorted(cluster.nodes.values_list("state", flat=True)) == ["draining", "draining", "ready"]
        rollout_step(rollout_id=rollout.pk)  # both drains done: back in service; the third waits for its job
        row.refresh_from_db()
        assert sorted(row.nodes_updated) == sorted([nodes[0].pk, nodes[1].pk]) and row.nodes_draining == []
        assert "protected job j-7" in row.reason and row.status == RolloutClusterStatus.TO_APPLY
        assert not SimulatedAddon.objects.filter(
            cluster=cluster, name="node-software.gpu_driver", version="560.35.03"
        ).exists()
    finally:
        hooks.register_drain_guard(previous)
    run_to_end(rollout)
    assert rollout.state == RolloutState.SUCCEEDED
    assert set(cluster.nodes.values_list("state", flat=True)) == {NodeState.READY}
    assert AuditEntry.objects.filter(action="node.drain").count() == 3
    assert SimulatedAddon.objects.get(cluster=cluster, name="node-software.gpu_driver").version == "560.35.03"


def test_a_drain_is_awaited_and_released_when_the_cluster_times_out(users):
    from tests.support.factories import make_node

    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False, node_software={"gpu_driver": "550.90.07"})
    (cluster,) = clusters_on(v1, 1)
    cluster.connection = {"apply_seconds": 0, "migration_pause_seconds": 3600}  # a drain that takes an hour
    cluster.save()
    node = make_node(cluster)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=ADDONS, node_software={"gpu_driver": "560.35.03"}, activate=True
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"tracking": True},
        strategy={"progress_deadline_seconds": 60, "auto_rollback": False},
    )
    now = timezone.now()
    rollout_step(rollout_id=rollout.pk, now=now)
    node.refresh_from_db()
    assert node.state == "draining"
    rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=30))
    assert "draining" in rollout.clusters.get().reason
    assert rollout_step(rollout_id=rollout.pk, now=now + timedelta(seconds=61)) == "stopped"
    node.refresh_from_db()
    assert node.state == "ready" and rollout.clusters.get().status == RolloutClusterStatus.TIMED_OUT


def test_pause_resume_cancel_and_manual_rollback(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 4)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 2})
    rollout_step(rollout_id=rollout.pk)
    rollout_pause(actor=actor, rollout=rollout)
    assert rollout_step(rollout_id=rollout.pk) == "idle"
    rollout_resume(actor=actor, rollout=rollout)
    rollout_step(rollout_id=rollout.pk)
    rollout_rollback(actor=actor, rollout=rollout, reason="latency regression")
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK
    touched = rollout.clusters.filter(rolled_back_at__isnull=False)
    assert touched.count() == 2
    assert set(rollout.batches.values_list("status", flat=True)) <= {"Passed", "Stopped"}
    for row in touched:
        row.cluster.refresh_from_db()
        assert row.cluster.blueprint_version == v1 and "latency regression" in row.cluster.pinned_reason
    with pytest.raises(ServiceError):
        rollout_cancel(actor=actor, rollout=rollout)
    # the clusters are free again for another rollout
    again = rollout_start(actor=actor, version=v2, targets={"clusters": [c.pk for c in clusters]})
    rollout_cancel(actor=actor, rollout=again)
    again.refresh_from_db()
    assert again.state == RolloutState.CANCELLED
    assert set(again.clusters.values_list("status", flat=True)) == {RolloutClusterStatus.SKIPPED}


def test_start_refuses_bad_input_and_writes_nothing(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 2)
    v2 = version_create(actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"))
    cases = [
        (dict(version=v2, targets={"tracking": True}), "version"),  # a draft
        (dict(version=v1, targets={"labels": {"nope": "x"}}), "targets"),
        (dict(version=v1, targets={"clusters": ["no-such"]}), "targets.clusters"),
        (dict(version=v1, targets={"tracking": True}, strategy={"batch_size": 0}), "strategy.batch_size"),
        (dict(version=v1, targets={"tracking": True}, strategy={"bogus": 1}), "strategy"),
    ]
    for kwargs, field in cases:
        with pytest.raises(ServiceError) as refused:
            rollout_start(actor=actor, **kwargs)
        assert refused.value.field == field, (kwargs, refused.value.detail)
    version_disable(actor=actor, version=v1)
    with pytest.raises(ServiceError) as refused:
        rollout_start(actor=actor, version=v1, targets={"tracking": True})
    assert refused.value.field == "version"
    v2.state = "active"
    v2.save()
    rollout_start(actor=actor, version=v2, targets={"clusters": [clusters[0].pk]})
    with pytest.raises(ServiceError) as refused:
        rollout_start(actor=actor, version=v2, targets={"clusters": [clusters[0].pk, clusters[1].pk]})
    assert refused.value.field == "targets" and clusters[0].name in refused.value.detail
    assert Rollout.objects.count() == 1


def test_change_window_defers_the_next_batch(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters_on(v1, 1)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    monday_night = timezone.now().replace(year=2026, month=11, day=30, hour=23, minute=0)
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"tracking": True},
        strategy={"change_window": {"days": [1], "start": "01:00", "end": "05:00"}},
    )
    assert rollout_step(rollout_id=rollout.pk, now=monday_night) == "outside-change-window"
    assert rollout_step(rollout_id=rollout.pk, now=monday_night + timedelta(hours=3)) == "batch-started"


def test_activation_while_every_tracking_cluster_is_busy_still_activates(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, strategy={"batch_size": 5, "soak_seconds": 3600})
    clusters_on(v1, 2)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    assert Rollout.objects.filter(version=v2).count() == 1
    v3 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.2"), activate=True
    )
    v3.refresh_from_db()
    assert v3.state == "active" and not Rollout.objects.filter(version=v3).exists()
    assert AuditEntry.objects.filter(action="blueprint.version_no_rollout").exists()


def test_rollout_list_and_detail_have_query_budgets(api, users, django_assert_max_num_queries):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters_on(v1, 6)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 2})
    api.as_token(actor, "read")
    with django_assert_max_num_queries(12):
        assert api.get("/api/v1/rollouts/").json()["count"] == 1
    with django_assert_max_num_queries(16):
        assert len(api.get(f"/api/v1/rollouts/{rollout.pk}/").json()["clusters"]) == 6


def test_a_step_takes_topics_in_the_one_global_order(users):
    """Every event a step writes is written topic by topic in sorted name order (cluster-…, fleet, rollout-…), the
    order every publisher takes topic rows in, so concurrent publishing transactions never deadlock."""
    from controlplane.models import Event

    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False, node_software={"cuda": "12.4"})
    clusters = clusters_on(v1, 3)
    from tests.support.factories import make_node

    for cluster in clusters:
        cluster.connection = {"apply_seconds": 0, "migration_pause_seconds": 0}
        cluster.save()
        make_node(cluster)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=ADDONS, node_software={"cuda": "12.6"}, activate=True
    )
    rollout = rollout_start(actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 3})
    for _ in range(2):  # drains requested; drains done, add-ons applied, clusters healthy
        before = Event.objects.order_by("-id").values_list("id", flat=True).first()
        did = rollout_step(rollout_id=rollout.pk)
        topics = list(Event.objects.filter(id__gt=before).order_by("id").values_list("topic", flat=True))
        assert len(topics) > 3 and topics == sorted(topics), (did, topics)


def test_rolling_back_node_software_drains_node_by_node_like_the_change(users):
    from fleet.choices import NodeState
    from fleet.tasks import rollout_sweep_task
    from tests.support.factories import make_node

    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False, node_software={"gpu_driver": "550.90.07"})  # budget 1
    (cluster,) = clusters_on(v1, 1)
    cluster.connection = {"apply_seconds": 0, "migration_pause_seconds": 0}
    cluster.save()
    nodes = [make_node(cluster) for _ in range(3)]
    v2 = version_create(
        actor=actor,
        blueprint=bp,
        addons=bump(ADDONS, "gpu-operator", "24.9.9"),
        node_software={"gpu_driver": "560.35.03"},
        policy={"disruption": {"max_unavailable_nodes": 2}},
        activate=True,
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"tracking": True},
        strategy={"soak_seconds": 3600, "auto_rollback": False},
    )
    for _ in range(6):
        rollout_step(rollout_id=rollout.pk)
    assert SimulatedAddon.objects.get(cluster=cluster, name="node-software.gpu_driver").version == "560.35.03"
    drains_forward = AuditEntry.objects.filter(action="node.drain").count()
    assert drains_forward == 3

    rollout_rollback(actor=actor, rollout=rollout, reason="bad driver")
    row = rollout.clusters.get()
    assert row.reverting is True
    # add-ons went back at once; the driver is still the new one until its nodes are drained
    assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "24.9.0"
    assert SimulatedAddon.objects.get(cluster=cluster, name="node-software.gpu_driver").version == "560.35.03"
    assert rollout_sweep_task() == 1  # beat keeps stepping a rollback that is still putting nodes back
    previous = hooks._drain_guard
    hooks.register_drain_guard(lambda node: (node.pk != nodes[1].pk, "protected job j-9 cannot move yet"))
    try:
        rollout_step(rollout_id=rollout.pk)
        assert sorted(cluster.nodes.values_list("state", flat=True)) == [
            "draining",
            "ready",
            "ready",
        ]  # budget 1 (v1)
        for _ in range(3):
            rollout_step(rollout_id=rollout.pk)
        row.refresh_from_db()
        assert row.reverting and "protected job j-9" in row.reason
    finally:
        hooks.register_drain_guard(previous)
    for _ in range(6):
        rollout_step(rollout_id=rollout.pk)
    row.refresh_from_db()
    assert row.reverting is False
    assert SimulatedAddon.objects.get(cluster=cluster, name="node-software.gpu_driver").version == "550.90.07"
    assert set(cluster.nodes.values_list("state", flat=True)) == {NodeState.READY}
    assert AuditEntry.objects.filter(action="node.drain").count() == drains_forward + 3
    assert rollout_sweep_task() == 0
