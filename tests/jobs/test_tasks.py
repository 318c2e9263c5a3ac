"""Each task once, twice (same outcome), and with its object gone; the sweep; the fleet hooks; pages per role."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet import hooks
from jobs.choices import ActionKind, FaultState
from jobs.models import FaultEvent, JobSnapshot, RecoveryAction
from jobs.services.faults import fault_ingest
from jobs.tasks import fault_handle_task, fault_sweep_task, recovery_advance_task, snapshot_schedule_task
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db


def test_fault_handle_task_once_twice_and_gone(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    first = fault_handle_task(fault.pk)
    assert len(first) == 1
    assert fault_handle_task(fault.pk) == []  # twice: same outcome, nothing new
    assert RecoveryAction.objects.filter(fault=fault).exclude(job=None).count() == 1
    assert fault_handle_task(10**9) == []  # gone
    assert recovery_advance_task()["completed"] == 1
    assert recovery_advance_task()["completed"] == 0


def test_sweep_requeues_only_old_new_faults(tenant_a):
    cluster = protected_cluster(nodes=1, spares=0, connection=INSTANT)
    node = node_of(submit(cluster, tenant_a, gpus=8))
    fresh, _ = fault_ingest(source="agent", kind="thermal", node=node)
    old, _ = fault_ingest(source="agent", kind="straggler", node=node)
    FaultEvent.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(minutes=1))
    assert fault_sweep_task() == 1
    fault_handle_task(old.pk)  # takes the whole cluster's new faults into one decision
    assert set(FaultEvent.objects.values_list("state", flat=True)) <= {FaultState.HANDLED, FaultState.IGNORED}
    assert fault_sweep_task() == 0
    assert fresh.pk


def test_fleet_hooks_count_faults_and_guard_drains(tenant_a):
    cluster = protected_cluster(nodes=2, spares=0, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    node = node_of(job)
    now = timezone.now()
    fault_ingest(source="agent", kind="thermal", node=node)
    assert hooks.count_faults([cluster.pk], now - timedelta(minutes=1), now + timedelta(minutes=1)) == 1
    assert hooks.count_faults([cluster.pk], now + timedelta(minutes=1), now + timedelta(minutes=2)) == 0
    ok, reason = hooks.may_drain(node)
    assert not ok and str(job.pk) in reason
    idle = cluster.nodes.exclude(pk=node.pk).first()
    assert hooks.may_drain(idle) == (True, "")


def test_scheduled_snapshots_and_snapshot_before_proactive_migration(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    version = cluster.blueprint_version
    version.policy = {**version.policy, "snapshot": {"interval_minutes": 30}}
    version.save()
    job = submit(cluster, tenant_a, gpus=8)
    assert snapshot_schedule_task() == 1
    assert snapshot_schedule_task() == 0  # not due again for 30 minutes
    recovery_advance_task()
    JobSnapshot.objects.all().delete()
    fault, _ = fault_ingest(source="predictor", kind="predicted_failure", node=node_of(job))
    [action_id] = fault_handle_task(fault.pk)
    assert RecoveryAction.objects.get(pk=action_id).kind == ActionKind.PROACTIVE_MIGRATION
    assert JobSnapshot.objects.filter(job=job, reason="planner").count() == 1


@pytest.mark.parametrize(
    "role,status", [("provider-admin", 200), ("operator", 200), ("tenant-admin", 200), ("tenant-viewer", 200)]
)
def test_pages_answer_every_role(client, users, role, status, tenant_a):
    client.force_login(users[role])
    for name in ("job-list", "fault-overview"):
        assert client.get(reverse(name)).status_code == status


def test_pages_need_a_login_and_cluster_feeds_follow_topic_rules(client, users, tenant_a):
    assert client.get(reverse("job-list")).status_code == 302
    shared = protected_cluster(nodes=1, spares=0)
    client.force_login(users["tenant-viewer"])
    assert client.get(reverse("fault-overview") + f"?cluster={shared.pk}").status_code == 404
    client.force_login(users["operator"])
    page = client.get(reverse("fault-overview") + f"?cluster={shared.pk}").content.decode()
    assert f'data-topic="cluster-{shared.pk}"' in page


def test_sweep_queues_one_task_per_cluster_with_old_new_faults(tenant_a, monkeypatch):
    """A decision takes all its cluster's new faults, so a backlog is nudged once per cluster, not once per fault."""
    from jobs.services import faults as fault_services

    queued = []
    monkeypatch.setattr(fault_services, "_enqueue", queued.append)
    clusters = [protected_cluster(nodes=3, spares=0, connection=INSTANT) for _ in range(2)]
    nodes = [node_of(submit(cluster, tenant_a, gpus=8)) for cluster in clusters for _ in range(3)]
    reported = [fault_ingest(source="agent", kind="thermal", node=node)[0] for node in nodes]
    FaultEvent.objects.update(received_at=timezone.now() - timedelta(minutes=1))
    assert fault_services.fault_sweep() == 2
    assert queued == [reported[0].pk, reported[3].pk]  # the oldest of each cluster
    for fault_id in queued:
        fault_handle_task(fault_id)
    assert not FaultEvent.objects.filter(state=FaultState.NEW).exists()
    queued.clear()
    assert fault_services.fault_sweep() == 0 and queued == []
