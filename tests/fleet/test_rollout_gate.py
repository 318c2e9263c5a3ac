"""The rollout gate on real fault rows: the real counter (hardware kinds on the batch's own nodes, one per
incident) and the Poisson-aware test; a sync-only drift while soaking waits instead of failing."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import hooks
from fleet.choices import RolloutClusterStatus, RolloutState
from fleet.gate import rate_rose_p
from fleet.models import Cluster, RolloutBatch, SimulatedAddon
from fleet.services.blueprints import version_create
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_start
from jobs.models import FaultEvent, Incident
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_node

pytestmark = pytest.mark.django_db

SOAK = timedelta(hours=6)


@pytest.fixture
def gate(settings):
    settings.ROLLOUT_GATE_SIGNIFICANCE = 0.005
    settings.ROLLOUT_GATE_BASELINE_HOURS = 24.0
    return settings


def faults(cluster, start, end, count, *, kind="gpu_xid", xid=79, incident_reports=1):
    """``count`` faults spread evenly over [start, end) on the cluster's nodes, each its own incident with
    ``incident_reports`` reports (the agent's Xid and Alertmanager's NodeDown of one failure)."""
    nodes = list(cluster.nodes.order_by("pk"))
    step = (end - start) / count
    rows = []
    for n in range(count):
        at, node = start + step * n + step / 2, nodes[n % len(nodes)]
        incident = Incident.objects.create(
            cluster=cluster,
            node=node,
            kind=kind,
            xid=xid,
            state="resolved",
            opened_at=at,
            last_reported_at=at,
            resolved_at=at,
        )
        for report in range(incident_reports):
            rows.append(
                FaultEvent(
                    kind=kind if report == 0 else "node_unreachable",
                    xid=xid if report == 0 else None,
                    cluster=cluster,
                    node=node,
                    detected_at=at,
                    received_at=at,
                    sources=["agent"],
                    correlation_key=f"{node.pk}:{kind}:{n}:{report}",
                    incident=incident,
                    state="handled",
                )
            )
    FaultEvent.objects.bulk_create(rows)


def noise(cluster, start, end, count):
    """Faults the gate must not count: predictions, the tenant's own crashes and hangs of its code, application
    Xids (13: a graphics engine exception the catalogue restarts the application for)."""
    nodes = list(cluster.nodes.order_by("pk"))
    step = (end - start) / count
    kinds = [("predicted_failure", None), ("software_crash", None), ("gpu_xid", 13), ("straggler", None)]
    FaultEvent.objects.bulk_create(
        [
            FaultEvent(
                kind=kinds[n % 4][0],
                xid=kinds[n % 4][1],
                cluster=cluster,
                node=nodes[n % len(nodes)],
                detected_at=start + step * n,
                received_at=start + step * n,
                sources=["api"],
                correlation_key=f"noise:{n}",
                state="handled",
            )
            for n in range(count)
        ]
    )


def a_rollout(users, *, auto_rollback=True):
    """Two simulated clusters of 8 nodes each, known to Lockstep for three days, one per batch."""
    actor = users["operator"]
    bp, v1 = blueprint(actor, auto_rollout=False)
    clusters = clusters_on(v1, 2)
    for cluster in clusters:
        for _ in range(8):
            make_node(cluster)
    Cluster.objects.filter(pk__in=[c.pk for c in clusters]).update(
        created_at=timezone.now() - timedelta(days=3)
    )
    v2 = version_create(
        actor=actor, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout = rollout_start(
        actor=actor,
        version=v2,
        targets={"clusters": [c.pk for c in clusters]},
        strategy={
            "batch_size": 1,
            "soak_seconds": int(SOAK.total_seconds()),
            "auto_rollback": auto_rollback,
            "max_failures": 0,
        },
    )
    first = rollout.clusters.get(batch_index=0).cluster
    other = next(c for c in clusters if c.pk != first.pk)
    return rollout, first, other


def soak_through(rollout, start):
    assert rollout_step(rollout_id=rollout.pk, now=start) == "batch-started"
    assert rollout.batches.get(index=0).status == RolloutBatch.Status.SOAKING
    return rollout_step(rollout_id=rollout.pk, now=start + SOAK + timedelta(seconds=1))


def test_a_harmless_batch_at_a_steady_rate_passes_with_the_real_counter(users, gate):
    rollout, first, other = a_rollout(users)
    start = timezone.now() - SOAK - timedelta(minutes=5)
    faults(first, start - timedelta(hours=24), start, 24)  # one an hour before the change
    faults(first, start, start + SOAK, 6, incident_reports=2)  # one an hour after it, each reported twice
    noise(first, start, start + SOAK, 40)  # none of these count
    faults(other, start, start + SOAK, 30)  # another batch's nodes
    assert soak_through(rollout, start) == "batch-passed"
    batch = rollout.batches.get(index=0)
    assert (batch.faults_before, batch.faults_after) == (24, 6)
    assert "hardware faults 6 in 48.0 node-hours since the change, 24 in 192.0 before" in batch.gate
    # the gate it replaced (faults after > faults in an equal window before, every kind) fails this batch
    every_kind_after = FaultEvent.objects.filter(cluster=first, detected_at__gte=start).count()
    every_kind_before = FaultEvent.objects.filter(
        cluster=first, detected_at__gte=start - SOAK, detected_at__lt=start
    ).count()
    assert every_kind_after > every_kind_before


def test_a_batch_whose_hardware_fault_rate_triples_fails_and_rolls_back(users, gate):
    rollout, first, _ = a_rollout(users)
    start = timezone.now() - SOAK - timedelta(minutes=5)
    faults(first, start - timedelta(hours=24), start, 24)
    faults(first, start, start + SOAK, 18)  # three an hour
    assert soak_through(rollout, start) == "stopped"
    rollout.refresh_from_db()
    batch = rollout.batches.get(index=0)
    assert (batch.faults_before, batch.faults_after) == (24, 18)
    assert batch.status == RolloutBatch.Status.FAILED and batch.gate.startswith(
        "fault rate rose: hardware faults 18"
    )
    assert rollout.state == RolloutState.ROLLED_BACK
    first.refresh_from_db()
    assert first.blueprint_version.number == 1


def test_the_counter_counts_hardware_faults_on_its_clusters_once_per_incident(users):
    _, first, other = a_rollout(users)
    now = timezone.now()
    faults(first, now - timedelta(hours=2), now, 4, incident_reports=3)
    noise(first, now - timedelta(hours=2), now, 12)
    faults(other, now - timedelta(hours=2), now, 5)
    node = first.nodes.first()
    FaultEvent.objects.create(
        kind="nic_down",
        cluster=first,
        node=node,
        detected_at=now - timedelta(minutes=1),
        sources=["agent"],
        correlation_key="loose",
    )  # no incident: counts on its own
    assert hooks.count_faults([first.pk], now - timedelta(hours=2), now) == 5
    assert hooks.count_faults([first.pk, other.pk], now - timedelta(hours=2), now) == 10
    assert hooks.count_faults([first.pk], now - timedelta(hours=1), now) == 3


def test_the_test_itself():
    assert rate_rose_p(0, 10, 1.0, 10.0) == 1.0  # nothing since the change
    assert rate_rose_p(5, 0, 1.0, 0.0) == 1.0  # no window before: nothing to tell
    assert rate_rose_p(1, 10, 1.0, 10.0) > 0.5  # the rate before, to the fault
    assert rate_rose_p(10, 10, 1.0, 10.0) < 1e-5  # ten times the rate
    assert rate_rose_p(2, 10, 1.0, 10.0) > rate_rose_p(3, 10, 1.0, 10.0)


def test_sync_only_drift_while_soaking_is_reported_and_waited_for(users, gate):
    rollout, first, _ = a_rollout(users, auto_rollback=False)
    start = timezone.now()
    assert rollout_step(rollout_id=rollout.pk, now=start) == "batch-started"
    SimulatedAddon.objects.filter(cluster=first, name="network-operator").update(values={"driftedBy": "hand"})
    assert rollout_step(rollout_id=rollout.pk, now=start + timedelta(seconds=10)) == "soaking"
    row = rollout.clusters.get(cluster=first)
    assert row.status == RolloutClusterStatus.SUCCEEDED and row.reason.startswith(
        "drift while soaking: network-operator"
    )
    assert rollout.clusters.filter(status=RolloutClusterStatus.FAILED).count() == 0
    end = start + SOAK + timedelta(seconds=1)
    assert rollout_step(rollout_id=rollout.pk, now=end) == "waiting-for-convergence"
    assert rollout.batches.get(index=0).status == RolloutBatch.Status.SOAKING
    SimulatedAddon.objects.filter(cluster=first, name="network-operator").update(values={})  # converged
    assert rollout_step(rollout_id=rollout.pk, now=end + timedelta(seconds=5)) == "batch-passed"
    row.refresh_from_db()
    assert row.reason == "InSync and Healthy (the drift converged)"


def test_drift_that_never_converges_fails_after_the_deadline_and_a_degraded_addon_at_once(users, gate):
    rollout, first, other = a_rollout(users, auto_rollback=False)
    rollout.max_failures = 1
    rollout.save(update_fields=["max_failures"])
    start = timezone.now()
    rollout_step(rollout_id=rollout.pk, now=start)
    SimulatedAddon.objects.filter(cluster=first, name="network-operator").update(version="0.0.1")
    rollout_step(rollout_id=rollout.pk, now=start + timedelta(seconds=10))
    late = start + SOAK + timedelta(seconds=rollout.progress_deadline_seconds + 2)
    assert rollout_step(rollout_id=rollout.pk, now=late) == "batch-passed"  # no cluster left to gate: passes
    row = rollout.clusters.get(cluster=first)
    assert row.status == RolloutClusterStatus.FAILED and row.reason.startswith("drift did not converge")
    # the next batch: a Degraded add-on while soaking is a health failure at once
    rollout_step(rollout_id=rollout.pk, now=late + timedelta(seconds=1))
    SimulatedAddon.objects.filter(cluster=other, name="nic-failover").update(failed=True)
    assert rollout_step(rollout_id=rollout.pk, now=late + timedelta(seconds=2)) == "stopped"
    row = rollout.clusters.get(cluster=other)
    assert (
        row.status == RolloutClusterStatus.FAILED
        and row.reason == "lost health while soaking: nic-failover Degraded"
    )
