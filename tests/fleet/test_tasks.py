"""Fleet tasks: once, twice, with the object gone; and a real prefork worker SIGKILLed in the middle of a rollout."""

import os
import random
import re
import signal
import time

import pytest

from controlplane.models import AuditEntry
from fleet.choices import RolloutClusterStatus, RolloutState
from fleet.models import DriftFinding, Rollout, SimulatedAddon
from fleet.services.blueprints import version_create
from fleet.services.rollouts import rollout_start
from fleet.tasks import cluster_reconcile_task, drift_sweep_task, rollout_progress_task, rollout_sweep_task
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.processes import celery_worker, wait_for


@pytest.mark.django_db
def test_rollout_progress_task_once_twice_and_gone(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters_on(v1, 2)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 1, "soak_seconds": 3600}
    )
    assert rollout_progress_task.run(rollout.pk) == "batch-started"
    assert rollout_progress_task.run(rollout.pk) == "soaking"  # the same state: nothing applied twice
    assert AuditEntry.objects.filter(action="rollout.cluster_apply").count() == 1
    assert rollout_progress_task.run(10**9) == "busy-or-gone"
    assert rollout_sweep_task.run() >= 1


def test_beat_drives_the_drift_sweep_and_rollout_steps(settings):
    from controlplane.celery import app

    schedule = {entry["task"]: entry["schedule"].total_seconds() for entry in app.conf.beat_schedule.values()}
    assert schedule["fleet.drift_sweep"] == settings.DRIFT_SWEEP_SECONDS
    assert schedule["fleet.rollout_sweep"] == settings.ROLLOUT_TICK_SECONDS


@pytest.mark.django_db
def test_drift_and_reconcile_tasks_once_twice_and_gone(users):
    from fleet.drivers.simulated import simulate_drift

    _, v1 = blueprint(users["operator"])
    (cluster,) = clusters_on(v1, 1)
    simulate_drift(cluster, addon="gpu-operator", kind="version", version="1.0.0")
    assert drift_sweep_task.run()["opened"] == 1
    assert drift_sweep_task.run()["opened"] == 0
    assert DriftFinding.objects.filter(resolved_at__isnull=True).count() == 1
    assert cluster_reconcile_task.run(cluster.pk)["corrected"] == ["gpu-operator"]
    assert cluster_reconcile_task.run(cluster.pk)["corrected"] == []
    assert cluster_reconcile_task.run(10**9) is None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigkill_of_a_worker_mid_rollout_skips_no_batch_and_applies_no_cluster_twice(tmp_path, users):
    """Each add-on apply blocks for 0.4 s, so a step applying a batch takes over a second; the worker is killed with
    SIGKILL at random moments (often mid-step), a fresh one started, and beat's sweep re-queues the step."""
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 6)
    for cluster in clusters:
        cluster.connection = {"apply_seconds": 0, "call_latency_seconds": 0.4}
        cluster.save()
    v2 = version_create(
        actor=actor,
        blueprint=bp,
        addons=bump(bump(ADDONS, "gpu-operator", "24.9.1"), "nic-failover", "1.3.0"),
        activate=True,
    )
    rollout = rollout_start(
        actor=actor, version=v2, targets={"tracking": True}, strategy={"batch_size": 2, "soak_seconds": 0}
    )
    rng = random.Random(7)
    kills = 0
    interrupted = 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        rollout.refresh_from_db()
        if rollout.state not in (RolloutState.PENDING, RolloutState.RUNNING):
            break
        with celery_worker(tmp_path, concurrency=2) as worker:
            for _ in range(3):  # beat's sweep, duplicated: two workers processes may race for the same step
                rollout_sweep_task.delay()
            time.sleep(rng.uniform(0.6, 1.6))
            if kills < 4:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
                kills += 1
                log = worker.log.read_text()
                # a step was under way when the worker died: received, never reported done
                received = set(re.findall(r"fleet\.rollout_progress\[([0-9a-f-]+)\] received", log))
                finished = set(re.findall(r"fleet\.rollout_progress\[([0-9a-f-]+)\] succeeded", log))
                interrupted += bool(received - finished)
            else:
                wait_for(
                    lambda: (
                        Rollout.objects.get(pk=rollout.pk).state == RolloutState.SUCCEEDED
                        or not rollout_sweep_task.delay()
                    ),
                    90,
                    interval=1.0,
                    what="the rollout to finish",
                )
    rollout.refresh_from_db()
    assert kills == 4 and interrupted >= 1, "no kill landed in the middle of a step"
    assert rollout.state == RolloutState.SUCCEEDED, rollout.reason
    rows = list(rollout.clusters.order_by("batch_index"))
    assert {row.status for row in rows} == {RolloutClusterStatus.SUCCEEDED}
    # no cluster applied twice: exactly one apply per cluster, all at the new version
    applies = AuditEntry.objects.filter(action="rollout.cluster_apply")
    assert sorted(int(a.object_id) for a in applies) == sorted(c.pk for c in clusters)
    for cluster in clusters:
        assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "24.9.1"
        assert SimulatedAddon.objects.get(cluster=cluster, name="nic-failover").version == "1.3.0"
    # no batch skipped: each started only after the one before it passed, in order
    batches = list(rollout.batches.order_by("index"))
    assert [b.status for b in batches] == ["Passed"] * 3
    for earlier, later in zip(batches, batches[1:], strict=False):
        assert later.started_at >= earlier.finished_at
    for row in rows:
        batch = batches[row.batch_index]
        assert batch.started_at <= row.applied_at <= batch.finished_at
