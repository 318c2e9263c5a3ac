"""Validation needs fresh evidence: a repaired node returns to service only after a health check carried out
through its driver and, where it has an agent, clean telemetry for a window after the check; the escalation
ladder's caps (the share circuit breaker) and the automation switch hold it."""

import json
import time
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.choices import AutomationMode, DriverName, NodeState
from fleet.drivers.simulated import fail_next_health_check
from fleet.models import Node, SimulatedOperation
from fleet.services.automation import automation_switch_set
from jobs.choices import EscalationStage
from jobs.models import NodeEscalation
from jobs.services.advance import recovery_advance
from jobs.services.escalation import escalation_advance, escalation_repaired
from jobs.services.faults import fault_handle, fault_ingest
from telemetry.services.tokens import agent_token_create
from tests.support.factories import make_cluster, make_node
from tests.support.jobs import protected_cluster
from tests.support.telemetry import batch, nic, reading

pytestmark = pytest.mark.django_db

INSTANT = {
    "migration_pause_seconds": 0,
    "nic_failover_seconds": 0,
    "restart_seconds": 0,
    "gpu_reset_seconds": 0,
    "snapshot_base_seconds": 0,
    "snapshot_seconds_per_gpu": 0,
    "health_check_seconds": 0,
}


def report_telemetry(client, node, token):
    """The node's agent posts one batch through the ingest API (which records that the node reported)."""
    now = time.time()
    body = batch(
        node.hostname,
        readings=[reading(i, now, node=node.hostname) for i in range(2)],
        nics=[nic("mlx5_0", now, node=node.hostname)],
    )
    answer = client.post(
        "/api/v1/ingest/telemetry/",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert answer.status_code == 200, answer.content


def failed_node(*, agent_client=None):
    """An idle node of a protected cluster that an Xid 79 took down the ladder to ``failed`` (reboot: a human)."""
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    node = Node.objects.filter(cluster=cluster, state=NodeState.READY).last()
    token = None
    if agent_client is not None:
        _, token = agent_token_create(actor=None, cluster=cluster, name="agents")
        report_telemetry(agent_client, node, token)
    fault, _ = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=0, node=node)
    fault_handle(fault_id=fault.pk)
    for _ in range(2):
        recovery_advance()
    assert NodeEscalation.objects.get(node=node).stage == EscalationStage.FAILED
    return cluster, node, token


def ladder(node):
    return NodeEscalation.objects.get(node=node)


def steps(escalation):
    return [(entry["step"], entry["result"]) for entry in escalation.evidence]


def test_a_failed_health_check_sends_the_node_back_to_failed(users, client):
    cluster, node, _ = failed_node()
    fail_next_health_check(cluster)
    escalation_repaired(actor=users["operator"], node=node, reason="rebooted")
    assert ladder(node).stage == EscalationStage.REPAIRED
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.FAILED and escalation.needs_human
    assert escalation.blocked.startswith("validation failed (health check sim-")
    assert Node.objects.get(pk=node.pk).state == NodeState.FAILED
    assert steps(escalation) == [("repaired", "ok"), ("health_check", "started"), ("health_check", "failed")]
    # the check ran on the cluster, through the driver, on this node
    check = SimulatedOperation.objects.get(cluster=cluster, operation="health_check")
    assert check.target == node.hostname and check.fails
    # the node's history on its cluster's page shows it
    client.force_login(users["operator"])
    page = client.get(reverse("fleet-cluster", args=[cluster.pk])).content.decode()
    section = page[page.index('id="cluster-repairs"') : page.index('id="cluster-rollouts"')]
    assert node.hostname in section and 'health_check: <span class="bad">failed</span>' in section
    assert "validation failed (health check sim-" in section
    # repaired again: this time the check passes; with no agent, no telemetry is awaited, and the node goes back
    # to the spare pool in the same beat (checked, validated, returned: each step ready as the one before ends)
    escalation_repaired(actor=users["operator"], node=node, reason="replaced the GPU")
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.RETURNED and not escalation.has_agent
    assert Node.objects.get(pk=node.pk).state == NodeState.SPARE
    assert steps(escalation) == [
        ("repaired", "ok"),
        ("health_check", "started"),
        ("health_check", "failed"),
        ("repaired", "ok"),
        ("health_check", "started"),
        ("health_check", "passed"),
        ("returned", "ok"),
    ]
    assert SimulatedOperation.objects.filter(cluster=cluster, operation="health_check").count() == 2


def test_a_passing_check_and_clean_telemetry_return_a_node_with_an_agent(users, client, settings):
    settings.ESCALATION_CLEAN_TELEMETRY_SECONDS = 300
    cluster, node, token = failed_node(agent_client=client)
    escalation_repaired(actor=users["operator"], node=node, reason="rebooted")
    recovery_advance()
    escalation = ladder(node)
    assert (
        escalation.stage == EscalationStage.VALIDATED and escalation.has_agent and escalation.check_passed_at
    )
    # the same beat looked at the window: it has not passed yet
    assert escalation.blocked.startswith("waits for clean telemetry until ")
    recovery_advance()  # the window has not passed
    assert ladder(node).stage == EscalationStage.VALIDATED
    # the window has passed (the check passed 301 s ago), but the node has not reported since: it waits
    passed = timezone.now() - timedelta(seconds=301)
    NodeEscalation.objects.filter(node=node).update(check_passed_at=passed)
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=passed - timedelta(seconds=60)
    )  # its report before the repair
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.VALIDATED and "last report" in escalation.blocked
    report_telemetry(client, node, token)  # fresh evidence: the node's agent reports after the window
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.RETURNED
    assert Node.objects.get(pk=node.pk).state == NodeState.SPARE
    assert steps(escalation) == [
        ("repaired", "ok"),
        ("health_check", "started"),
        ("health_check", "passed"),
        ("telemetry", "clean"),
        ("returned", "ok"),
    ]


def test_a_fault_in_the_clean_window_or_silence_sends_it_back(users, client, settings):
    settings.ESCALATION_CLEAN_TELEMETRY_SECONDS = 300
    cluster, node, token = failed_node(agent_client=client)
    escalation_repaired(actor=users["operator"], node=node)
    recovery_advance()
    assert ladder(node).stage == EscalationStage.VALIDATED
    fault, _ = fault_ingest(source="agent", kind="nic_down", nic_name="mlx5_0", node=node)
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.FAILED and f"fault {fault.pk} (nic_down)" in escalation.blocked
    assert Node.objects.get(pk=node.pk).state == NodeState.FAILED
    # repaired again, passes its check, then stays silent for twice the window
    escalation_repaired(actor=users["operator"], node=node)
    recovery_advance()
    assert ladder(node).stage == EscalationStage.VALIDATED
    passed = timezone.now() - timedelta(seconds=601)
    NodeEscalation.objects.filter(node=node).update(check_passed_at=passed)
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=passed - timedelta(seconds=60)
    )  # its report before the repair
    recovery_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.FAILED and "no telemetry since" in escalation.blocked
    assert steps(escalation)[-1] == ("telemetry", "silent")


def test_a_driver_without_health_checks_holds_the_node_for_a_human(users):
    cluster = make_cluster(driver=DriverName.KUBERNETES, connection={"kubeconfig": "/nonexistent"})
    node = make_node(cluster, state=NodeState.FAILED)
    NodeEscalation.objects.create(node=node, stage=EscalationStage.FAILED, needs_human=True)
    escalation_repaired(actor=users["operator"], node=node)
    escalation_advance()
    escalation = ladder(node)
    assert escalation.stage == EscalationStage.REPAIRED and escalation.needs_human
    assert (
        escalation.blocked
        == "health check could not run: the kubernetes driver does not support health_check"
    )
    assert Node.objects.get(pk=node.pk).state == NodeState.FAILED


def test_paused_automation_holds_the_ladder(users):
    cluster, node, _ = failed_node()
    escalation_repaired(actor=users["operator"], node=node)
    automation_switch_set(actor=users["provider-admin"], mode=AutomationMode.PAUSED)
    assert escalation_advance() == 0
    assert ladder(node).stage == EscalationStage.REPAIRED and not ladder(node).check_handle
    automation_switch_set(actor=users["provider-admin"], mode=AutomationMode.ACTIVE)
    cluster.automation = AutomationMode.PAUSED
    cluster.save(update_fields=["automation"])
    assert escalation_advance() == 0
    cluster.automation = AutomationMode.ACTIVE
    cluster.save(update_fields=["automation"])
    # checked and validated, then returned to the spare pool (no agent): two steps in the one beat
    assert escalation_advance() == 2 and ladder(node).stage == EscalationStage.RETURNED


def test_the_share_circuit_breaker_makes_a_quarantine_wait_and_retry(users):
    cluster = protected_cluster(nodes=4, spares=1, connection=INSTANT)  # 5 nodes; 20 %: one out at a time
    cluster.fleet.max_disrupted_percent = 20
    cluster.fleet.save(update_fields=["max_disrupted_percent"])
    first, second = Node.objects.filter(cluster=cluster, state=NodeState.READY).order_by("pk")[:2]
    for node in (first, second):
        fault, _ = fault_ingest(source="agent", kind="gpu_xid", xid=79, gpu_index=0, node=node)
        fault_handle(fault_id=fault.pk)
    assert Node.objects.get(pk=first.pk).state == NodeState.CORDONED
    waiting = ladder(second)
    assert Node.objects.get(pk=second.pk).state == NodeState.READY
    assert waiting.stage == EscalationStage.QUARANTINED and waiting.blocked.startswith(
        "cordon waits: circuit breaker"
    )
    recovery_advance()  # the first drains: still out
    assert Node.objects.get(pk=second.pk).state == NodeState.READY
    recovery_advance()  # the first is failed (out of the breaker's count): room for the second
    recovery_advance()
    assert Node.objects.get(pk=first.pk).state == NodeState.FAILED
    # Taken out now; how far down its ladder it got in these calls depends on the order beat meets the two
    # ladders (and, on a loaded machine, on when their instant drains are seen done), so any stage past the wait.
    assert Node.objects.get(pk=second.pk).state in (NodeState.CORDONED, NodeState.DRAINING, NodeState.FAILED)
    assert ladder(second).stage != EscalationStage.QUARANTINED and not ladder(second).blocked.startswith(
        "cordon waits"
    )


def test_every_action_of_the_ladder_has_its_timestamps_in_order(users):
    """detected ≤ planned ≤ started ≤ ended on every step (a step used to be planned after it started: its
    ``planned_at`` default was taken after the ``started_at`` it was given)."""
    from rest_framework.test import APIClient

    from jobs.models import RecoveryAction
    from tests.support.factories import token_header

    _, node, _ = failed_node()
    escalation_repaired(actor=users["operator"], node=node, reason="rebooted")
    for _ in range(3):
        recovery_advance()
    assert ladder(node).stage == EscalationStage.RETURNED
    client = APIClient()
    client.credentials(**token_header(users["operator"]))
    rows = client.get("/api/v1/actions/", {"page_size": 100}).json()["results"]
    assert len(rows) == RecoveryAction.objects.count() >= 3
    for row in rows:
        stamps = [row[key] for key in ("detected_at", "planned_at", "started_at", "ended_at") if row.get(key)]
        assert stamps == sorted(stamps), row
