"""One automation switch: a fleet's or cluster's dry-run / pause governs drift correction and rollout steps as
well as fault recovery, and the provider's switch (``/api/v1/automation/``) pauses all of it everywhere."""

import pytest
from rest_framework.test import APIClient

from controlplane.models import AuditEntry, Event
from fleet.choices import AutomationMode, RolloutClusterStatus, RolloutState
from fleet.drivers.simulated import simulate_drift
from fleet.models import AutomationSwitch, Cluster, DriftFinding, SimulatedAddon
from fleet.services.automation import automation_switch_set
from fleet.services.blueprints import version_create
from fleet.services.drift import drift_sweep
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_start
from jobs.choices import FaultState
from jobs.models import FaultEvent, JobAllocation
from jobs.services.faults import fault_handle, fault_ingest, fault_sweep
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_fleet, token_header
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db


def version_of(cluster, addon="gpu-operator"):
    return SimulatedAddon.objects.get(cluster=cluster, name=addon).version


def test_dry_run_drift_records_what_it_would_correct_and_pause_holds(users):
    _, v1 = blueprint(users["operator"], drift_mode="correct")
    active, dry = clusters_on(v1, 2)
    (paused,) = clusters_on(v1, 1, fleet=make_fleet(automation=AutomationMode.PAUSED))  # the fleet's switch
    Cluster.objects.filter(pk=dry.pk).update(automation=AutomationMode.DRY_RUN)
    for cluster in (active, dry, paused):
        simulate_drift(cluster, addon="gpu-operator", kind="version", version="25.0.0")
    report = drift_sweep()
    assert report.opened == 3 and report.corrected == 1 and report.would_correct == 1 and report.held == 1
    assert version_of(active) == "24.9.0"  # corrected
    assert version_of(dry) == version_of(paused) == "25.0.0"  # nothing touched
    note = {
        f.cluster_id: f.last_correction_error for f in DriftFinding.objects.filter(resolved_at__isnull=True)
    }
    assert note[dry.pk] == "dry run: would re-apply the desired state" and note[paused.pk].startswith("held")
    audit = AuditEntry.objects.get(action="drift.correct", object_id=str(dry.pk))
    assert audit.changes == {"dry_run": True, "would_correct": ["gpu-operator"]}
    assert Event.objects.filter(
        kind="drift.changed", topic=f"cluster-{dry.pk}", payload__would_correct=["gpu-operator"]
    ).exists()
    again = drift_sweep()  # the same dry run is not recorded twice
    assert (
        again.would_correct == 1
        and AuditEntry.objects.filter(action="drift.correct", object_id=str(dry.pk)).count() == 1
    )
    Cluster.objects.filter(pk=dry.pk).update(automation=AutomationMode.ACTIVE)
    drift_sweep()
    assert version_of(dry) == "24.9.0"  # acting again corrects it


def test_dry_run_and_paused_clusters_in_a_rollout(users):
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    active, dry, paused = clusters_on(v1, 3)
    Cluster.objects.filter(pk=dry.pk).update(automation=AutomationMode.DRY_RUN)
    Cluster.objects.filter(pk=paused.pk).update(automation=AutomationMode.PAUSED)
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"clusters": [active.pk, dry.pk, paused.pk]},
        strategy={"batch_size": 3, "soak_seconds": 0, "max_failures": 0, "progress_deadline_seconds": 60},
    )
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    rollout_step(rollout_id=rollout.pk, now=now)
    rows = {row.cluster_id: row for row in rollout.clusters.all()}
    assert version_of(active) == "24.9.1"
    assert version_of(dry) == "24.9.0" and rows[dry.pk].status == RolloutClusterStatus.SKIPPED
    assert rows[dry.pk].reason.startswith("dry run: would apply gpu-base v2")
    audit = AuditEntry.objects.get(action="rollout.cluster_apply", object_id=str(dry.pk))
    assert audit.changes["dry_run"] is True and audit.changes["would"]["blueprint_version"] == [
        "gpu-base v1",
        "gpu-base v2",
    ]
    assert version_of(paused) == "24.9.0" and rows[paused.pk].status == RolloutClusterStatus.TO_APPLY
    assert rows[paused.pk].reason.startswith("held")
    # held past the progress deadline: pausing is no failure
    later = now + timedelta(seconds=120)
    assert rollout_step(rollout_id=rollout.pk, now=later) == "batch-progressing"
    assert rollout.clusters.get(cluster=paused).status == RolloutClusterStatus.TO_APPLY
    Cluster.objects.filter(pk=paused.pk).update(automation=AutomationMode.ACTIVE)
    for step in range(5):
        rollout_step(rollout_id=rollout.pk, now=later + timedelta(seconds=step + 1))
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.SUCCEEDED and version_of(paused) == "24.9.1"


def test_the_provider_switch_pauses_drift_rollouts_and_fault_recovery(users, tenant_a):
    admin = users["provider-admin"]
    bp, v1 = blueprint(users["operator"], auto_rollout=False, drift_mode="correct")
    (drifted,) = clusters_on(v1, 1)
    simulate_drift(drifted, addon="gpu-operator", kind="version", version="25.0.0")
    v2 = version_create(
        actor=admin, blueprint=bp, addons=bump(ADDONS, "network-operator", "24.8.0"), activate=True
    )
    rollout = rollout_start(
        actor=admin, version=v2, targets={"clusters": [drifted.pk]}, strategy={"soak_seconds": 0}
    )
    recovering = protected_cluster(nodes=2, spares=1)
    job = submit(recovering, tenant_a, gpus=8)
    node = JobAllocation.objects.filter(job=job).first().node

    automation_switch_set(actor=admin, mode=AutomationMode.PAUSED, reason="datacentre maintenance")
    assert recovering.effective_automation == AutomationMode.PAUSED
    assert drift_sweep().held == 1 and version_of(drifted) == "25.0.0"
    assert rollout_step(rollout_id=rollout.pk) == "held"
    rollout.refresh_from_db()
    assert (
        rollout.state == RolloutState.PENDING and rollout.reason == "held: automation is paused provider-wide"
    )
    assert version_of(drifted, "network-operator") == "24.7.0"
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node)
    assert fault_handle(fault_id=fault.pk) == []
    fault.refresh_from_db()
    assert fault.state == FaultState.NEW and fault.state_reason.startswith(
        "held: automation is paused (provider-wide"
    )
    assert fault_sweep(min_age_seconds=0) == 0  # held faults are not re-queued either

    automation_switch_set(actor=admin, mode=AutomationMode.ACTIVE)
    assert fault_sweep(min_age_seconds=0) == 1
    assert len(fault_handle(fault_id=fault.pk)) == 1
    assert FaultEvent.objects.get(pk=fault.pk).state != FaultState.NEW
    assert drift_sweep().corrected == 1 and version_of(drifted) == "24.9.0"
    rollout_step(rollout_id=rollout.pk)
    assert version_of(drifted, "network-operator") == "24.8.0"


def test_the_provider_switch_through_the_api(users):
    client = APIClient()
    client.credentials(**token_header(users["operator"]))
    assert client.get("/api/v1/automation/").json()["mode"] == "active"
    # DESIGN: an operator may dry-run or pause automation; setting it active again is the provider admin's.
    answer = client.put("/api/v1/automation/", {"mode": "dry-run", "reason": "night shift"}, format="json")
    assert answer.status_code == 200 and answer.json()["changed_by"] == users["operator"].username
    answer = client.put("/api/v1/automation/", {"mode": "active"}, format="json")
    assert answer.status_code == 403 and "only the provider admin sets it active" in answer.content.decode()
    client.credentials(**token_header(users["tenant-admin"]))
    assert client.get("/api/v1/automation/").status_code == 403
    assert client.put("/api/v1/automation/", {"mode": "paused"}, format="json").status_code == 403
    assert AutomationSwitch.objects.get().mode == "dry-run"
    client.credentials(**token_header(users["provider-admin"]))
    assert client.put("/api/v1/automation/", {"mode": "active"}, format="json").status_code == 200
    AuditEntry.objects.filter(action="automation.switch").delete()
    for bad in ({}, {"mode": "off"}, {"mode": ["paused"]}, {"mode": "paused", "reason": "x" * 301}):
        answer = client.put("/api/v1/automation/", bad, format="json")
        assert answer.status_code == 400, (bad, answer.content)
    answer = client.put("/api/v1/automation/", {"mode": "paused", "reason": "fabric upgrade"}, format="json")
    assert answer.status_code == 200
    body = answer.json()
    assert body["mode"] == "paused" and body["reason"] == "fabric upgrade"
    assert body["changed_by"] == users["provider-admin"].username and body["changed_at"]
    entry = AuditEntry.objects.get(action="automation.switch")
    assert entry.changes == {"mode": ["active", "paused"], "reason": "fabric upgrade"}
    assert entry.actor_name == users["provider-admin"].username
    assert Event.objects.filter(topic="fleet", kind="automation.updated", payload__mode="paused").exists()
    client.credentials(**token_header(users["operator"]))
    assert client.get("/api/v1/automation/").json()["mode"] == "paused"


def test_pausing_provider_wide_notifies(users):
    from telemetry.models import NotificationDelivery
    from telemetry.services.channels import channel_create
    from telemetry.services.notifications import notifications_dispatch

    channel_create(actor=users["provider-admin"], name="pager", url="https://pager.example/hook")
    automation_switch_set(actor=users["provider-admin"], mode=AutomationMode.PAUSED, reason="maintenance")
    notifications_dispatch()
    delivery = NotificationDelivery.objects.get(rule="automation_paused")
    assert "the whole provider" in delivery.summary


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_holds_rollouts_and_drift_correction_while_the_provider_switch_is_paused(
    tmp_path, users
):
    from fleet.models import Rollout
    from fleet.tasks import drift_sweep_task, rollout_progress_task
    from tests.support.processes import celery_worker, wait_for

    admin = users["provider-admin"]
    bp, v1 = blueprint(admin, auto_rollout=False, drift_mode="correct")
    (cluster,) = clusters_on(v1, 1)
    simulate_drift(cluster, addon="gpu-operator", kind="version", version="25.0.0")
    v2 = version_create(
        actor=admin, blueprint=bp, addons=bump(ADDONS, "network-operator", "24.8.0"), activate=True
    )
    rollout = rollout_start(
        actor=admin, version=v2, targets={"clusters": [cluster.pk]}, strategy={"soak_seconds": 0}
    )
    automation_switch_set(actor=admin, mode=AutomationMode.PAUSED, reason="maintenance")
    with celery_worker(tmp_path):
        rollout_progress_task.delay(rollout.pk)
        drift_sweep_task.delay()
        wait_for(
            lambda: (
                Rollout.objects.get(pk=rollout.pk).reason == "held: automation is paused provider-wide"
                and DriftFinding.objects.filter(last_correction_error__startswith="held").exists()
            ),
            60,
            what="the paused worker to hold both",
        )
        assert version_of(cluster) == "25.0.0" and version_of(cluster, "network-operator") == "24.7.0"
        automation_switch_set(actor=admin, mode=AutomationMode.ACTIVE)
        rollout_progress_task.delay(rollout.pk)
        drift_sweep_task.delay()
        wait_for(
            lambda: version_of(cluster) == "24.9.0" and version_of(cluster, "network-operator") == "24.8.0",
            60,
            what="the worker to correct the drift and apply the rollout",
        )


def test_a_provider_wide_dry_run_records_instead_of_acting(users):
    admin = users["provider-admin"]
    bp, v1 = blueprint(admin, auto_rollout=False, drift_mode="correct")
    drifted, moved = clusters_on(v1, 2)
    simulate_drift(drifted, addon="gpu-operator", kind="version", version="25.0.0")
    v2 = version_create(
        actor=admin, blueprint=bp, addons=bump(ADDONS, "network-operator", "24.8.0"), activate=True
    )
    rollout = rollout_start(
        actor=admin, version=v2, targets={"clusters": [moved.pk]}, strategy={"soak_seconds": 0}
    )
    automation_switch_set(actor=admin, mode=AutomationMode.DRY_RUN)
    assert drift_sweep().would_correct == 1 and version_of(drifted) == "25.0.0"
    rollout_step(rollout_id=rollout.pk)
    row = rollout.clusters.get()
    assert row.status == RolloutClusterStatus.SKIPPED and row.reason.startswith("dry run: would apply")
    assert version_of(moved, "network-operator") == "24.7.0"
