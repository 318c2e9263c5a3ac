"""Draining a node moves its jobs off it through the fault path, completes when none is left, and says what it
waits for (and, past its deadline, that it is overdue, once)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Event
from fleet.choices import AutomationMode, NodeState
from fleet.models import Node
from fleet.services.nodes import node_drain, nodes_drain
from jobs.choices import ActionKind, ActionState, FaultKind, FaultState, JobState
from jobs.models import FaultEvent, NodeEscalation, RecoveryAction
from jobs.selectors import node_drain as node_drain_status
from jobs.services.advance import recovery_advance
from jobs.services.drain import drain_request, drain_waits, drains_advance
from jobs.services.faults import fault_handle, fault_ingest
from telemetry.services.notifications import RULES
from tests.support.factories import make_cluster
from tests.support.jobs import INSTANT, beat_in_a_thread, bulk_nodes, node_of, protected_cluster, submit
from tests.support.processes import celery_worker, wait_for

pytestmark = pytest.mark.django_db


def drain_and_decide(node):
    """Drain the node as its page does, raise its drain request as the hook's task does, and decide it."""
    node_drain(actor=None, node=node, reason="maintenance")
    [request_id] = drain_request(node_ids=[node.pk])
    return FaultEvent.objects.get(pk=request_id), fault_handle(fault_id=request_id)


def test_draining_a_protected_job_s_node_live_migrates_it_and_the_drain_completes(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=16)
    drained = node_of(job)
    request, [action_id] = drain_and_decide(drained)
    assert request.kind == FaultKind.DRAIN and request.sources == ["lockstep"]
    assert request.triage["job_impact"] == "node" and not request.triage["out_of_service"]
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.LIVE_MIGRATION and action.node_id == drained.pk
    assert action.state == ActionState.RUNNING and action.to_node.state == NodeState.SPARE
    # Not a failure: no ladder, no hardware marked broken.
    assert not NodeEscalation.objects.filter(node=drained, stage="quarantined").exists()
    assert drains_advance()["completed"] == 0  # the job is still there
    assert recovery_advance()["completed"] == 1
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and node_of(job).pk == action.to_node_id != drained.pk
    assert drains_advance()["completed"] == 1
    drained.refresh_from_db()
    assert drained.state == NodeState.CORDONED and drained.state_reason.startswith("drained")
    # One request per drain: a second sweep, or the hook's task again, raises nothing new.
    assert drain_request(node_ids=[drained.pk]) == []
    assert FaultEvent.objects.filter(node=drained, kind=FaultKind.DRAIN).count() == 1
    assert RecoveryAction.objects.filter(job=job).count() == 1


def test_draining_an_unprotected_job_s_node_restarts_it_elsewhere(tenant_a):
    cluster = make_cluster(connection=INSTANT)
    bulk_nodes(cluster, 2)
    bulk_nodes(cluster, 2, state=NodeState.SPARE)
    job = submit(cluster, tenant_a, gpus=8, checkpoint_interval=100)
    drained = node_of(job)
    _, [action_id] = drain_and_decide(drained)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and "not protected" in action.reason
    assert node_of(job).pk != drained.pk  # its workers were placed on a spare as the restart started
    # ... but it has left only once the restart succeeded: until then the drain waits for it.
    assert drains_advance()["completed"] == 0
    drained.refresh_from_db()
    [wait] = drain_waits(drained)["waits"]
    assert wait["job"].pk == job.pk and f"(action {action.pk}) running" in wait["what"]
    recovery_advance()
    assert drains_advance()["completed"] == 1
    drained.refresh_from_db()
    assert drained.state == NodeState.CORDONED


def test_the_bulk_drain_moves_the_jobs_of_every_node_once(tenant_a):
    cluster = protected_cluster(nodes=4, spares=2, connection=INSTANT)
    first = submit(cluster, tenant_a, gpus=8)
    second = submit(cluster, tenant_a, gpus=8)
    nodes = [node_of(first), node_of(second)]
    assert nodes[0].pk != nodes[1].pk
    nodes_drain(actor=None, nodes=nodes, reasons={})
    requests = drain_request(node_ids=[node.pk for node in nodes])
    assert len(requests) == 2
    created = fault_handle(fault_id=requests[0])
    kinds = RecoveryAction.objects.filter(pk__in=created).values_list("job_id", "kind")
    assert sorted(kinds) == sorted([(first.pk, "live_migration"), (second.pk, "live_migration")])


def test_a_job_that_cannot_move_is_listed_with_what_it_waits_for_and_since_when(tenant_a, users):
    # No spare anywhere: the unprotected job's restart waits for a healthy spare, and the drain waits for it.
    cluster = make_cluster(connection=INSTANT)
    bulk_nodes(cluster, 1)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    status = None
    node_drain(actor=None, node=drained, reason="maintenance")
    drained.refresh_from_db()
    status = drain_waits(drained)
    [wait] = status["waits"]
    assert wait["job"].pk == job.pk and "not asked to move yet" in wait["what"]
    assert wait["since"] == drained.state_changed_at
    [request_id] = drain_request(node_ids=[drained.pk])
    [action_id] = fault_handle(fault_id=request_id)
    action = RecoveryAction.objects.get(pk=action_id)
    assert action.state == ActionState.PLANNED and "waiting for a healthy spare" in action.error
    drains_advance()
    drained.refresh_from_db()
    assert drained.state == NodeState.DRAINING
    status = node_drain_status(user=users["operator"], node=drained)
    [wait] = status["waits"]
    assert wait["job"].pk == job.pk and wait["since"] == action.planned_at
    assert f"restart from checkpoint (action {action.pk}) planned" in wait["what"]
    assert "waiting for a healthy spare" in wait["what"] and not status["overdue"]


def test_paused_automation_holds_the_drain_and_the_page_says_so(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT, automation=AutomationMode.PAUSED)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    request, created = drain_and_decide(drained)
    assert created == []
    drained.refresh_from_db()
    [wait] = drain_waits(drained)["waits"]
    assert "is not decided" in wait["what"] and "paused" in wait["what"]
    assert wait["since"] == request.received_at


def test_past_its_deadline_a_drain_is_announced_once(tenant_a, settings):
    settings.DRAIN_DEADLINE_SECONDS = 60
    cluster = make_cluster(connection=INSTANT)
    bulk_nodes(cluster, 1)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    drain_and_decide(drained)
    assert drains_advance()["overdue"] == 0  # not yet
    later = timezone.now() + timedelta(seconds=61)
    assert drains_advance(now=later)["overdue"] == 1
    assert drains_advance(now=later + timedelta(hours=1))["overdue"] == 0  # once per drain
    [event] = Event.objects.filter(kind="node.drain_overdue", topic="fleet")
    assert event.payload["node"] == drained.pk and event.payload["jobs"] == [job.pk]
    assert "waiting for a healthy spare" in event.payload["waits"]
    matches, describe = RULES["drain_overdue"]
    assert matches(event.kind, event.payload) and drained.hostname in describe(event.payload)
    drained.refresh_from_db()
    assert drain_waits(drained, now=later)["overdue"] and not drain_waits(drained)["overdue"]


def test_an_empty_node_s_drain_completes_at_once_and_raises_no_request(tenant_a):
    cluster = make_cluster(connection=INSTANT)
    [node] = bulk_nodes(cluster, 1)
    node_drain(actor=None, node=node, reason="maintenance")
    assert drain_request(node_ids=[node.pk]) == []
    assert drains_advance() == {"completed": 1, "requested": 0, "overdue": 0}
    node.refresh_from_db()
    assert node.state == NodeState.CORDONED
    assert not FaultEvent.objects.filter(kind=FaultKind.DRAIN).exists()


def test_a_missing_drain_request_is_raised_by_beat(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    node_drain(actor=None, node=drained, reason="maintenance")  # the hook's message was lost
    assert drains_advance()["requested"] == 1
    request = FaultEvent.objects.get(kind=FaultKind.DRAIN, node=drained)
    assert request.state == FaultState.NEW and request.details["jobs"] == [job.pk]


def test_no_reporter_may_raise_a_drain(tenant_a, api, users):
    from controlplane.errors import ServiceError

    cluster = make_cluster(connection=INSTANT)
    [node] = bulk_nodes(cluster, 1)
    with pytest.raises(ServiceError):
        fault_ingest(source="agent", kind="drain", node=node)
    with pytest.raises(ServiceError):
        fault_ingest(source="lockstep", kind="node_unreachable", node=node)
    api.as_token(users["operator"])
    for payload in (
        {"kind": "drain"},
        {"kind": "drain", "source": "lockstep"},
        {"kind": "thermal", "source": "lockstep"},
    ):
        answer = api.post("/api/v1/faults/", {"node": node.pk, **payload}, format="json")
        assert answer.status_code == 400 and "only Lockstep raises" in answer.content.decode(), payload
    assert not FaultEvent.objects.exists()


def drain_beat(interval: float = 0.2):
    """Beat's recovery and drain steps in a thread while the block runs (as celery beat would run them)."""
    return beat_in_a_thread(interval=interval, drains=True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_moves_the_jobs_of_a_drained_node_and_the_drain_completes(tenant_a, tmp_path):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    protected = submit(cluster, tenant_a, gpus=16)
    drained = node_of(protected)
    with celery_worker(tmp_path) as worker, drain_beat():
        node_drain(actor=None, node=drained, reason="maintenance")  # committed: the hook queues the request
        wait_for(
            lambda: Node.objects.get(pk=drained.pk).state == NodeState.CORDONED,
            60,
            0.3,
            what="the job moved off and the drain completed",
        )
        log = worker.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    [action] = RecoveryAction.objects.filter(job=protected)
    assert action.kind == ActionKind.LIVE_MIGRATION and action.state == ActionState.SUCCEEDED
    assert node_of(protected).pk == action.to_node_id
    assert FaultEvent.objects.get(kind=FaultKind.DRAIN, node=drained).state == FaultState.HANDLED


def test_on_kubernetes_a_protected_job_is_restarted_off_the_drained_node(tenant_a, monkeypatch):
    # The Kubernetes driver evicts the node's pods and cannot migrate a worker: the decision takes the one move it
    # offers, a restart from checkpoint placed on a spare (the job's own launcher brings it back).
    from fleet.drivers.kubernetes import KubernetesDriver
    from tests.support.jobs import protect
    from tests.support.kubernetes import FakeCore, pod

    core = FakeCore(pods=[pod("job-worker-0")])
    monkeypatch.setattr(KubernetesDriver, "core_api_factory", staticmethod(lambda connection: core))
    cluster = protect(make_cluster(driver="kubernetes", connection={"in_cluster": True}))
    ready = bulk_nodes(cluster, 2)
    bulk_nodes(cluster, 1, state=NodeState.SPARE)
    job = submit(cluster, tenant_a, gpus=8, hostnames=[ready[0].hostname])  # registered by its launcher
    drained = node_of(job)
    _, [action_id] = drain_and_decide(drained)
    action = RecoveryAction.objects.get(pk=action_id)
    assert ("evict", "train", "job-worker-0", "job-worker-0") in core.calls
    assert action.kind == ActionKind.RESTART_FROM_CHECKPOINT and action.state == ActionState.RUNNING
    live = next(o for o in action.alternatives if o["kind"] == "live_migration")
    assert not live["feasible"]
    assert node_of(job).pk != drained.pk
    recovery_advance()
    assert drains_advance()["completed"] == 1
    drained.refresh_from_db()
    assert drained.state == NodeState.CORDONED
    assert core.calls[-1] == ("patch_node", drained.hostname, {"spec": {"unschedulable": True}})


def test_a_job_already_moving_off_the_node_folds_the_drain_into_its_recovery(tenant_a):
    cluster = protected_cluster(nodes=2, spares=2, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    node = node_of(job)
    fault, _ = fault_ingest(source="predictor", kind="predicted_failure", node=node)
    [moving] = fault_handle(fault_id=fault.pk)
    assert RecoveryAction.objects.get(pk=moving).state == ActionState.RUNNING
    request, created = drain_and_decide(node)
    assert created == []  # one recovery per job: no second move, no thrash
    request.refresh_from_db()
    assert request.state == FaultState.HANDLED
    assert f"folded into its proactive_migration (action {moving})" in request.state_reason
    node.refresh_from_db()
    [wait] = drain_waits(node)["waits"]
    assert f"(action {moving}) running" in wait["what"]
    recovery_advance()
    assert drains_advance()["completed"] == 1
    assert RecoveryAction.objects.filter(job=job).count() == 1


def test_in_dry_run_the_drain_says_the_move_was_decided_not_carried_out(tenant_a):
    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT, automation=AutomationMode.DRY_RUN)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    _, [action_id] = drain_and_decide(drained)
    assert RecoveryAction.objects.get(pk=action_id).dry_run
    recovery_advance()
    assert drains_advance()["completed"] == 0
    drained.refresh_from_db()
    [wait] = drain_waits(drained)["waits"]
    assert wait["what"] == "dry run: live migration was decided, not carried out"


def test_the_drain_tasks_run_twice_alike_and_do_nothing_for_a_node_that_is_gone(tenant_a):
    from jobs.tasks import drain_request_task, drains_advance_task

    cluster = protected_cluster(nodes=2, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    drained = node_of(job)
    node_drain(actor=None, node=drained, reason="maintenance")
    [request_id] = drain_request_task([drained.pk])
    assert drain_request_task([drained.pk]) == []
    assert drains_advance_task() == drains_advance_task() == {"completed": 0, "requested": 0, "overdue": 0}
    assert FaultEvent.objects.filter(kind=FaultKind.DRAIN).values_list("pk", flat=True).get() == request_id
    gone = (
        Node.objects.order_by("-pk").values_list("pk", flat=True).first() + 1
    )  # (a node with jobs cannot go)
    assert drain_request_task([gone]) == []
