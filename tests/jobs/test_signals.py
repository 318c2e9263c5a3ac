"""The signals the fault path used to miss (issue 15): grey links from the agent's counters, failback once a link is
clean, silent nodes, a silent cluster, hung jobs, and the planner's prices measured from what recoveries took.
On PostgreSQL and Redis; the agent-batch paths with a real prefork Celery worker deciding."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.choices import LinkState, NodeState, Reachability
from fleet.models import NIC, Cluster, Node
from jobs.choices import ActionKind, ActionState, FaultKind, JobState
from jobs.models import FaultEvent, Incident, JobAllocation, JobPhase, RecoveryAction, RecoveryEstimate
from jobs.services.advance import recovery_advance
from jobs.services.estimates import estimates_for, estimates_record
from jobs.services.faults import fault_handle, fault_ingest
from jobs.services.links import links_fail_back
from jobs.services.silence import hang_threshold, silence_sweep
from telemetry.models import NotificationChannel, NotificationDelivery
from telemetry.services.notifications import notifications_dispatch
from telemetry.services.tokens import agent_token_create
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import celery_worker, wait_for
from tests.support.telemetry import batch, nic

pytestmark = pytest.mark.django_db

INSTANT = {
    "migration_pause_seconds": 0,
    "nic_failover_seconds": 0,
    "restart_seconds": 0,
    "gpu_reset_seconds": 0,
}


def node_of(job, rank_start=0):
    return JobAllocation.objects.get(job=job, rank_start=rank_start).node


def agent_client(cluster):
    _, raw = agent_token_create(actor=None, cluster=cluster, name=f"agents-{cluster.pk}")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def send(client, hostname, ts, symbol_error, link_state="up"):
    body = batch(hostname, nics=[nic("mlx5_2", ts=ts, link_state=link_state, symbol_error=symbol_error)])
    response = client.post("/api/v1/ingest/telemetry/", body, format="json")
    assert response.status_code in (200, 201, 202), response.content


# --- grey links ----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_rising_symbol_errors_fail_over_then_fail_back_with_the_measured_degraded_time(
    tmp_path, tenant_a, settings
):
    """Two agent batches five seconds apart, symbol errors up by 100, link up: a link_degraded fault that the Celery
    worker decides (failover against running degraded, both priced); once the link stays clean the job fails back,
    and the ledger books the degraded time it measured."""
    settings.LINK_CLEAN_SECONDS = 2
    cluster = protected_cluster(nodes=2, spares=1, connection={**INSTANT, "nic_failover_seconds": 0.2})
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    node = node_of(job)
    agent = agent_client(cluster)
    with celery_worker(tmp_path):
        t0 = time.time() - 10
        send(agent, node.hostname, t0, 0)
        send(agent, node.hostname, t0 + 5, 100)
        fault = FaultEvent.objects.get(kind=FaultKind.LINK_DEGRADED, node=node)
        assert fault.details["symbol_rate_per_hour"] > settings.TELEMETRY_SYMBOL_ERRORS_PER_HOUR
        assert fault.triage["job_impact"] == "degraded"
        wait_for(
            lambda: RecoveryAction.objects.filter(fault=fault).exists(), 30, what="the worker's decision"
        )
    action = RecoveryAction.objects.get(fault=fault)
    assert action.kind == ActionKind.NIC_FAILOVER and action.nic_name == "mlx5_2"
    weighed = {o["kind"]: o for o in action.alternatives}
    assert weighed["stay_degraded"]["gpu_hours_lost"] > weighed["nic_failover"]["gpu_hours_lost"]
    assert weighed["stay_degraded"]["slowdown"] == pytest.approx(0.30)
    assert action.estimate["nic_failover"]["basis"].startswith("default")
    wait_for(
        lambda: (
            (recovery_advance(), RecoveryAction.objects.get(pk=action.pk).state)[1] == ActionState.SUCCEEDED
        ),
        10,
        what="the failover to finish",
    )
    job.refresh_from_db()
    assert job.degraded_at(timezone.now()) and job.slowdown == pytest.approx(0.01)
    assert links_fail_back() == 0  # no clean readings yet: still degraded
    completed = RecoveryAction.objects.get(pk=action.pk).ended_at
    for _ in range(4):  # the link stays up, the counter still: clean
        time.sleep(1)
        send(agent, node.hostname, time.time(), 100)
    assert links_fail_back() == 1
    action.refresh_from_db()
    job.refresh_from_db()
    measured = (action.failed_back_at - completed).total_seconds()
    assert (
        action.degraded_seconds == pytest.approx(measured) and 2 <= measured < 30
    )  # measured, not the expected 600 s
    assert action.gpu_hours_lost == pytest.approx(
        16 * (action.pause_seconds + 0.01 * measured) / 3600, rel=1e-6
    )
    assert not job.degraded_at(timezone.now()) and job.slowdown == 0
    assert not JobPhase.objects.filter(job=job, kind="degraded", ended_at__isnull=True).exists()
    assert NIC.objects.get(node=node, name="mlx5_2").link_state == LinkState.UP
    assert RecoveryEstimate.objects.get(
        cluster=cluster, kind="link_degraded_seconds"
    ).last_seconds == pytest.approx(measured)


def test_running_degraded_is_recorded_with_its_comparison_and_ends_when_the_link_is_clean(tenant_a, settings):
    """With no healthy NIC left to fail over to, running on the degraded link is the choice; the fault keeps the
    comparison, the job runs slower in a degraded phase named by the link, and it ends once the link is repaired."""
    settings.LINK_CLEAN_SECONDS = 0
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    NIC.objects.filter(node=node).exclude(name="mlx5_2").update(link_state=LinkState.DOWN)
    fault, _ = fault_ingest(
        source="agent",
        kind="link_degraded",
        node=node,
        nic_name="mlx5_2",
        details={"link_state": "up", "symbol_rate_per_hour": 5000.0},
    )
    assert fault_handle(fault_id=fault.pk) == []
    fault.refresh_from_db()
    decision = fault.details["decision"]
    assert decision["chosen"] == "stay_degraded"
    kinds = {o["kind"]: o for o in decision["options"]}
    assert not kinds["nic_failover"]["feasible"] and "stay_degraded" in fault.state_reason
    job.refresh_from_db()
    assert job.slowdown == pytest.approx(0.30) and job.degraded_at(timezone.now())
    phase = JobPhase.objects.get(job=job, kind="degraded", ended_at__isnull=True)
    assert (phase.node_id, phase.nic_name) == (node.pk, "mlx5_2")
    assert links_fail_back() == 0  # the link is still marked degraded, and no telemetry says otherwise
    NIC.objects.filter(node=node, name="mlx5_2").update(link_state=LinkState.UP)  # repaired
    assert links_fail_back() == 1
    job.refresh_from_db()
    assert (
        job.slowdown == 0
        and not JobPhase.objects.filter(job=job, kind="degraded", ended_at__isnull=True).exists()
    )


# --- silence -------------------------------------------------------------------------------------------------


def _seen(cluster, ago_seconds, nodes=None):
    rows = (
        Node.objects.filter(cluster=cluster)
        if nodes is None
        else Node.objects.filter(pk__in=[n.pk for n in nodes])
    )
    rows.update(last_seen_at=timezone.now() - timedelta(seconds=ago_seconds))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_silent_agent_becomes_node_unreachable_in_the_nodes_incident_and_is_recovered(
    tmp_path, tenant_a, settings
):
    settings.AGENT_INTERVAL_SECONDS, settings.SILENCE_INTERVALS = 10, 3
    cluster = protected_cluster(nodes=4, spares=2, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    node = node_of(job)
    Node.objects.filter(cluster=cluster, state=NodeState.SPARE).update(
        last_seen_at=None
    )  # never reported: not judged
    _seen(cluster, 5, nodes=[n for n in Node.objects.filter(cluster=cluster, state=NodeState.READY)])
    earlier, _ = fault_ingest(
        source="agent", kind="thermal", node=node
    )  # the node's incident is open already
    _seen(cluster, 45, nodes=[node])
    with celery_worker(tmp_path):
        assert silence_sweep()["node_unreachable"] == 1
        assert silence_sweep()["node_unreachable"] == 0  # raised once per silence
        fault = FaultEvent.objects.get(kind=FaultKind.NODE_UNREACHABLE, node=node)
        assert fault.sources == ["heartbeat"] and fault.details["silent_seconds"] >= 45
        assert fault.incident_id == FaultEvent.objects.get(pk=earlier.pk).incident_id
        assert Incident.objects.get(pk=fault.incident_id).kind == "node_unreachable"
        wait_for(
            lambda: RecoveryAction.objects.filter(fault=fault, job=job).exists(),
            30,
            what="the worker's decision",
        )
    assert RecoveryAction.objects.get(fault=fault, job=job).kind == ActionKind.LIVE_MIGRATION
    assert not FaultEvent.objects.filter(kind=FaultKind.NODE_UNREACHABLE).exclude(node=node).exists()


def test_half_the_cluster_silent_at_once_drains_nothing_marks_it_unreachable_and_says_so(tenant_a, settings):
    settings.AGENT_INTERVAL_SECONDS, settings.SILENCE_INTERVALS = 10, 3
    NotificationChannel.objects.create(name="ops", url="http://127.0.0.1:9/hook")
    cluster = protected_cluster(nodes=6, spares=2, connection=INSTANT)
    submit(cluster, tenant_a, gpus=16)
    nodes = list(Node.objects.filter(cluster=cluster).order_by("pk"))
    _seen(cluster, 5)
    _seen(cluster, 40, nodes=nodes[:2])
    _seen(cluster, 45, nodes=nodes[2:4])  # four of eight, within two intervals of each other
    notifications_dispatch()
    counts = silence_sweep()
    assert counts["clusters_unreachable"] == 1 and counts["node_unreachable"] == 0
    assert not FaultEvent.objects.exists()
    assert not Node.objects.filter(
        cluster=cluster, state__in=[NodeState.CORDONED, NodeState.DRAINING]
    ).exists()
    assert Cluster.objects.get(pk=cluster.pk).reachability == Reachability.UNREACHABLE
    assert silence_sweep()["clusters_unreachable"] == 0  # said once
    notifications_dispatch()
    assert NotificationDelivery.objects.filter(rule="cluster_unreachable").count() == 1
    _seen(cluster, 1)  # it reports again
    assert silence_sweep()["clusters_reachable"] == 1
    assert Cluster.objects.get(pk=cluster.pk).reachability == Reachability.REACHABLE


def test_a_node_that_never_reported_is_not_judged(tenant_a, settings):
    cluster = protected_cluster(nodes=3, spares=0, connection=INSTANT)
    Node.objects.filter(cluster=cluster).update(last_seen_at=None)
    assert silence_sweep() == {
        "node_unreachable": 0,
        "clusters_unreachable": 0,
        "clusters_reachable": 0,
        "hang": 0,
    }


# --- hangs ---------------------------------------------------------------------------------------------------


def test_hang_threshold_is_k_times_the_median_step_with_a_floor(settings):
    settings.HANG_STEP_MULTIPLE, settings.HANG_FLOOR_SECONDS = 10, 120
    assert hang_threshold([1.0, 2.0, 30.0]) == 120  # 10 × 2 s is under the floor
    assert hang_threshold([20.0, 25.0, 900.0]) == 250  # the median, not the mean
    assert hang_threshold([]) == 120


def test_a_job_that_stops_reporting_progress_hangs_and_restarts(tenant_a, settings):
    settings.HANG_STEP_MULTIPLE, settings.HANG_FLOOR_SECONDS = 10, 120
    cluster = protected_cluster(nodes=4, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16)
    other = submit(cluster, tenant_a, gpus=8)
    quiet = submit(cluster, tenant_a, gpus=8)  # never reported progress: not judged
    client = APIClient()
    for step in range(1, 4):
        for mine in (job, other):
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {mine.token}")
            response = client.post(
                f"/api/v1/jobs/{mine.pk}/progress/",
                {"iteration": step * 10, "step_seconds": 20.0},
                format="json",
            )
            assert response.status_code == 200, response.content
    type(job).objects.filter(pk=job.pk).update(
        iteration_at=timezone.now() - timedelta(seconds=260)
    )  # > 10 × 20 s
    type(job).objects.filter(pk=other.pk).update(
        iteration_at=timezone.now() - timedelta(seconds=150)
    )  # < 200 s
    type(job).objects.filter(pk=quiet.pk).update(iteration_at=timezone.now() - timedelta(days=1))
    assert silence_sweep()["hang"] == 1
    assert silence_sweep()["hang"] == 0
    fault = FaultEvent.objects.get(kind=FaultKind.HANG)
    assert fault.details["job"] == job.pk and fault.details["threshold_seconds"] == 200
    assert fault.triage["job_impact"] == "restart"
    [action_id] = fault_handle(fault_id=fault.pk)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.job_id == job.pk and action.kind == ActionKind.RESTART_FROM_CHECKPOINT
    recovery_advance()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert not RecoveryAction.objects.filter(job=other).exists()  # the other job on the node is not hit


# --- measured prices -----------------------------------------------------------------------------------------


def test_the_planner_prices_move_toward_what_recoveries_measured(tenant_a, settings):
    settings.RECOVERY_ESTIMATE_MIN_SAMPLES = 5
    cluster = protected_cluster(nodes=2, spares=1, connection={**INSTANT, "nic_failover_seconds": 0.3})
    assert (
        estimates_for(cluster).nic_failover == 1.0
        and estimates_for(cluster).basis_of("nic_failover") == "default"
    )
    job = submit(cluster, tenant_a, gpus=16)
    node = node_of(job)
    fault, _ = fault_ingest(source="agent", kind="nic_down", node=node, nic_name="mlx5_3")
    began = time.monotonic()
    [action_id] = fault_handle(fault_id=fault.pk)
    time.sleep(0.35)
    recovery_advance()
    took = time.monotonic() - began  # the most the recovery can have measured, however loaded the machine
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.state == ActionState.SUCCEEDED
    row = RecoveryEstimate.objects.get(cluster=cluster, kind="nic_failover")
    assert row.samples == 1 and 0.3 <= row.last_seconds <= took
    assert estimates_for(cluster).nic_failover == 1.0  # one measurement is not enough
    estimates_record([(cluster.pk, "nic_failover", 0.3)] * 4)
    measured = estimates_for(cluster)
    assert measured.nic_failover < 1.0 and measured.basis_of("nic_failover").startswith(
        "measured: average of 5"
    )
    before = measured.nic_failover
    estimates_record([(cluster.pk, "nic_failover", 0.3)] * 5)
    assert abs(estimates_for(cluster).nic_failover - 0.3) < abs(before - 0.3)
    # The next plan uses it, and says so.
    fault, _ = fault_ingest(source="agent", kind="nic_down", node=node, nic_name="mlx5_4")
    [action_id] = fault_handle(fault_id=fault.pk)
    chosen = RecoveryAction.objects.get(pk=action_id)
    assert chosen.estimate["nic_failover"]["basis"].startswith("measured")
    assert chosen.estimate["nic_failover"]["seconds"] == pytest.approx(
        estimates_for(cluster).nic_failover, abs=1e-3
    )
