"""Precursors from the simulator's fault model, sent as the agents send them, through ingest, the risk sweep, a
prediction and the proactive migration of a protected job (decided by a real Celery worker) before the fault
strikes, to the outcome on the predictions page; and a fleet without precursors, where nothing may be predicted.

The simulator's own code makes the readings (``simulator.runner.Runner``: its ``_precursors`` ramps, its
``_batch`` relay payload, its ``_strike``), on a clock the test steps: the batches of the precursor's first
two minutes are posted as they would have been sent (timestamps in the past), and the sweep runs at each minute
of that clock, as beat runs it.
"""

import random
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.access import Role
from fleet.models import Node
from jobs.choices import ActionState
from jobs.models import FaultEvent, Job, JobAllocation, RecoveryAction
from simulator.runner import PRECURSOR_SECONDS, GPUSim, NICSim, NodeSim, Pending, Runner, RunnerStats
from simulator.sampling import Strike
from telemetry.models import Prediction
from telemetry.prediction import online
from telemetry.prediction.risk import NodeFeatures
from telemetry.services.prediction import (
    emptied_before_failure,
    prediction_metrics,
    predictions_resolve,
    risk_sweep,
)
from telemetry.services.tokens import agent_token_create
from tests.support.factories import make_user
from tests.support.jobs import beat_in_a_thread, protected_cluster, submit
from tests.support.processes import celery_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TICK = 10.0  # the simulator's tick: one batch per cluster every 10 s
SWEEP = 60.0  # RISK_SWEEP_SECONDS: beat sweeps once a minute
STRIKES = {  # precursor -> the fault it announces (simulator.profiles)
    "thermal": Strike(0.0, "GPU", "gpu_xid", 79, "thermal", "agent", 0),
    "ecc": Strike(0.0, "GPU HBM3 Memory", "ecc_uncorrectable", 48, "ecc", "agent", 0),
    "nic": Strike(0.0, "Network Switch/Cable", "nic_down", None, "nic", "agent", 0),
}


def simulated_fleet(cluster, seed: int) -> Runner:
    """The simulator's runner for this cluster's nodes, without its world, HTTP session or fault sampler."""
    runner = Runner.__new__(Runner)
    runner.random = random.Random(seed)
    runner.nodes, runner.racks, runner.pending, runner.stats = [], {}, [], RunnerStats()
    for node in Node.objects.filter(cluster=cluster).order_by("hostname"):
        gpus = [GPUSim(temperature=runner.random.uniform(48, 62)) for _ in range(node.gpus.count())]
        nics = {name: NICSim() for name in node.nics.order_by("name").values_list("name", flat=True)}
        runner.nodes.append(
            NodeSim(node.id, node.hostname, node.rack, cluster.name, node.leaf_switch, gpus, nics)
        )
        runner.racks.setdefault((cluster.name, node.rack), 180_000.0)
    return runner


def world(tenant):
    """A protected cluster (four nodes, two spares) running a 16-GPU job, and the simulator's agent token."""
    cluster = protected_cluster(nodes=4, spares=2)
    job = submit(cluster, tenant, gpus=16, checkpoint_interval=10**9)
    # it has trained for an hour since its last checkpoint: a failure would cost that hour, so moving pays
    Job.objects.filter(pk=job.pk).update(iteration_at=timezone.now() - timedelta(hours=1))
    node = (
        JobAllocation.objects.filter(job=job, released_at__isnull=True)
        .order_by("node__hostname")
        .first()
        .node
    )
    _, raw = agent_token_create(actor=None, cluster=cluster, name="simulator")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return cluster, job, node, agent


def warm_up(runner, *, until: float, days: float = 1.5) -> None:
    """The fleet has run for ``days`` before the test: each node's streaming detectors have seen, once a minute
    (as the sweep feeds them), its hottest GPU and its error rate as the simulator makes them when nothing is
    wrong, so they are past their day of learning."""
    noise = random.Random(11)
    for minute in range(int(days * 1440), 0, -1):
        features = {}
        for node in runner.nodes:
            hottest = max(gpu.temperature for gpu in node.gpus) + abs(noise.gauss(0, 0.8))
            features[node.id] = NodeFeatures(
                node_id=node.id, temperature_max=hottest, sbe_rate_max=noise.choice([0.0] * 9 + [36.0])
            )
        online.observe(features, until - 60.0 * minute)


def post(agent, runner, cluster, ts, events=()):
    body = runner._batch(cluster.name, ts, list(events))
    response = agent.post("/api/v1/ingest/telemetry/", body, format="json")
    assert response.status_code in (200, 201, 202), response.content[:300]


def run_precursor_clock(agent, runner, cluster, *, start: float, seconds: float) -> list[int]:
    """Post a batch every tick of [start, start + seconds) and sweep every SWEEP seconds, until a sweep raises a
    prediction; returns the predictions raised.

    The clock stops there, while the worker decides: a decision reads the spare pool with SKIP LOCKED, and a sweep
    or a batch writing the spares' rows at that moment hides them, so the decision finds no spare and waits and
    sees (most likely; reported to the fault path's owner, docs/prediction.md)."""
    raised = []
    for i in range(int(seconds / TICK)):
        ts = start + i * TICK
        runner._precursors(ts)
        post(agent, runner, cluster, ts)
        if i and i % int(SWEEP / TICK) == 0:
            raised += risk_sweep(now=datetime.fromtimestamp(ts, UTC)).predictions
            if raised:
                break
    return raised


@pytest.fixture
def clean_detectors():
    online.client().delete(online.HASH)
    yield
    online.client().delete(online.HASH)


@pytest.mark.parametrize("precursor", ["thermal", "ecc", "nic"])
def test_a_precursor_becomes_a_prediction_a_proactive_move_before_the_fault_and_a_true_outcome(
    tmp_path, tenant_a, client, precursor, clean_detectors
):
    cluster, job, node, agent = world(tenant_a)
    runner = simulated_fleet(cluster, seed=5)
    sim_node = next(n for n in runner.nodes if n.id == node.pk)
    warm_up(runner, until=time.time() - 160.0)
    with celery_worker(tmp_path) as worker, beat_in_a_thread(cluster_ids=[cluster.pk]):
        # the precursor's first minutes, as sent, from now: the warm-up and the worker's start (tens of seconds on a
        # loaded machine) take nothing from the 144 s the prediction's horizon gives the move and the strike
        start = time.time() - 160.0
        item = Pending(STRIKES[precursor], sim_node, 1, due=start + PRECURSOR_SECONDS)
        runner.pending.append(item)
        raised = run_precursor_clock(agent, runner, cluster, start=start, seconds=160.0)
        predictions = list(Prediction.objects.filter(pk__in=raised))
        assert [p.node_id for p in predictions] == [node.pk], [(p.node_id, p.cause) for p in predictions]
        prediction = predictions[0]
        assert prediction.cause_kind == precursor, prediction.cause
        # the horizon is the fault model's 24 h at the simulator's 600x: 144 s of wall clock
        assert prediction.horizon_hours * 3600 == pytest.approx(144.0)

        def moved():
            return RecoveryAction.objects.filter(
                fault_id=prediction.fault_id, kind="proactive_migration", state=ActionState.SUCCEEDED
            ).exists()

        wait_for(moved, 60, 0.3, what="the proactive migration off the node at risk")
        assert not JobAllocation.objects.filter(job=job, node=node, released_at__isnull=True).exists()
        # the fault strikes, as the simulator strikes it, after the node was emptied
        events: dict = {}
        runner._strike(item, events)
        post(agent, runner, cluster, time.time(), events.get(cluster.name, []))
        wait_for(
            lambda: FaultEvent.objects.filter(node=node, kind=item.strike.kind).exists(),
            20,
            0.2,
            what=f"the {item.strike.kind} fault",
        )
        log = worker.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    predictions_resolve()
    prediction.refresh_from_db()
    assert prediction.outcome == Prediction.Outcome.FAILED and 0 < prediction.lead_seconds <= 144.0
    assert prediction.action_taken == "proactive_migration"
    assert emptied_before_failure([prediction]) == {prediction.pk}
    figures = prediction_metrics()
    assert figures["precision"] == 1.0 and figures["recall"] == 1.0 and figures["emptied"] == 1
    assert 0 < figures["chance_precision"] < 0.5 and figures["precision_lift"] > 2
    client.force_login(make_user(Role.OPERATOR))
    page = client.get("/predictions/").content.decode()
    later = prediction_metrics()
    assert "after its node was emptied" in page and "Random at the same rate" in page
    # the page computes its figures between the two computations here, over a period that grows with the clock
    # (its chance falls, its lift rises: by 0.26 over a loaded machine's minute): it shows a lift between them
    shown = float(re.search(r"precision by chance; lift ([0-9.]+)×", page).group(1))
    bounds = sorted((figures["precision_lift"], later["precision_lift"]))
    assert bounds[0] - 0.05 <= shown <= bounds[1] + 0.05, (shown, bounds)


def test_without_a_precursor_nothing_is_predicted_and_the_fault_is_a_miss(
    tmp_path, tenant_a, client, clean_detectors
):
    cluster, job, node, agent = world(tenant_a)
    runner = simulated_fleet(cluster, seed=6)
    sim_node = next(n for n in runner.nodes if n.id == node.pk)
    warm_up(runner, until=time.time() - 160.0)
    strike = Strike(0.0, "GPU", "gpu_xid", 79, "", "agent", 0)  # strikes without warning
    with celery_worker(tmp_path) as worker, beat_in_a_thread(cluster_ids=[cluster.pk]):
        start = time.time() - 160.0
        raised = run_precursor_clock(agent, runner, cluster, start=start, seconds=160.0)
        assert raised == [] and not Prediction.objects.exists()
        events: dict = {}
        runner._strike(Pending(strike, sim_node, 1, due=time.time()), events)
        post(agent, runner, cluster, time.time(), events.get(cluster.name, []))
        wait_for(
            lambda: FaultEvent.objects.filter(node=node, kind="gpu_xid").exists(), 20, 0.2, what="the Xid"
        )
        log = worker.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    risk_sweep()
    assert not Prediction.objects.exists()
    figures = prediction_metrics()
    assert figures["predictions"] == 0 and figures["failures"] == 1 and figures["precision"] is None
    client.force_login(make_user(Role.OPERATOR))
    assert "of 1 hardware failure;" in client.get("/predictions/").content.decode()
