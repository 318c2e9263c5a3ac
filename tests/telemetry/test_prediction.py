"""Risk scoring, predictions raised once and judged against what happened, and their live figures."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import FaultEvent
from jobs.services.faults import fault_ingest
from telemetry.models import FacilityState, GPUState, NICState, Prediction, RiskSample
from telemetry.prediction.risk import NodeFeatures, RackFacility, node_risk
from telemetry.services.prediction import prediction_metrics, predictions_resolve, risk_sweep
from tests.support.factories import make_cluster, make_node


def test_a_quiet_node_scores_zero_and_each_sign_raises_it():
    assert node_risk(NodeFeatures(node_id=1, temperature_max=60)).score == 0.0
    warming = node_risk(NodeFeatures(node_id=1, temperature_max=78, temperature_trend_max=40, hottest_gpu=3))
    assert warming.score > 0.8 and warming.kind == "thermal" and "GPU 3" in warming.cause
    ecc = node_risk(NodeFeatures(node_id=1, sbe_rate_max=900))
    assert ecc.kind == "ecc" and 0.8 < ecc.score <= 0.9
    both = node_risk(NodeFeatures(node_id=1, sbe_rate_max=150, nic_symbol_rate_max=1000))
    alone = node_risk(NodeFeatures(node_id=1, sbe_rate_max=150))
    assert both.score > alone.score  # several weak signs add up


def test_a_rack_losing_cooling_is_one_cause_for_all_its_nodes():
    rack = RackFacility(pressure_drop=0.3, warming=4.0)
    risks = [
        node_risk(NodeFeatures(node_id=n, rack="rack07", temperature_trend_max=4.0), rack) for n in range(3)
    ]
    assert {r.kind for r in risks} == {"facility"} and len({r.cause for r in risks}) == 1
    assert "rack rack07" in risks[0].cause and risks[0].score > 0.8


@pytest.fixture
def cluster_with_state(db):
    cluster = make_cluster()
    nodes = [make_node(cluster, f"n{i}", rack="rack01" if i < 2 else "rack02") for i in range(4)]
    now = timezone.now()
    for node in nodes:
        for gpu in node.gpus.all():
            GPUState.objects.create(gpu=gpu, node=node, ts=now, temperature=60.0, temperature_ewma=60.0)
        for nic in node.nics.all():
            NICState.objects.create(nic=nic, node=node, ts=now, link_state="up")
    return cluster, nodes


@pytest.mark.django_db
def test_sweep_scores_records_and_predicts_once(cluster_with_state):
    cluster, nodes = cluster_with_state
    hot = nodes[1]
    GPUState.objects.filter(node=hot, gpu__index=2).update(temperature=80.0, temperature_trend=45.0)
    result = risk_sweep()
    assert result.nodes == 4 and len(result.predictions) == 1
    hot.refresh_from_db()
    assert hot.risk_score > 0.8 and hot.risk_updated_at is not None
    prediction = Prediction.objects.get()
    assert prediction.node == hot and prediction.cause_kind == "thermal" and prediction.outcome == "open"
    fault = FaultEvent.objects.get(kind="predicted_failure")
    assert fault.sources == ["predictor"] and fault.details["prediction"] == prediction.pk
    assert RiskSample.objects.filter(node=hot).count() == 1
    again = risk_sweep()
    assert (
        again.predictions == [] and Prediction.objects.count() == 1
    )  # an open prediction is not raised twice


@pytest.mark.django_db
def test_facility_drift_predicts_the_whole_rack(cluster_with_state):
    cluster, nodes = cluster_with_state
    now = timezone.now()
    FacilityState.objects.create(
        cluster=cluster,
        scope="rack",
        target="rack01",
        series="cdu|loop|cdu_differential_pressure_pascals",
        metric="cdu_differential_pressure_pascals",
        ts=now,
        value=120_000,
        ewma=120_000,
        baseline=180_000,
    )
    GPUState.objects.filter(node__rack="rack01").update(temperature_trend=5.0)
    result = risk_sweep()
    predicted = set(Prediction.objects.values_list("node__hostname", flat=True))
    assert predicted == {"n0", "n1"} and len(result.predictions) == 2
    assert {p.cause for p in Prediction.objects.all()} == {Prediction.objects.first().cause}


@pytest.mark.django_db
def test_predictions_are_judged_and_measured(cluster_with_state, settings):
    settings.SIMULATOR_ACCELERATION = 1.0  # the fault model's time is the wall clock: a 24 h horizon
    cluster, nodes = cluster_with_state
    GPUState.objects.filter(node__in=nodes[:2]).update(sbe_rate=2000.0)
    risk_sweep()
    assert Prediction.objects.count() == 2
    later = timezone.now() + timedelta(hours=2)
    fault_ingest(
        source="agent", kind="ecc_uncorrectable", node=nodes[0], gpu_index=1, detected_at=timezone.now()
    )
    fault_ingest(source="agent", kind="nic_down", node=nodes[3], nic_name="mlx5_1")  # not predicted
    predictions_resolve(now=later)
    came_true = Prediction.objects.get(node=nodes[0])
    assert (
        came_true.outcome == "failed"
        and came_true.lead_seconds >= 0
        and came_true.failure.kind == "ecc_uncorrectable"
    )
    assert Prediction.objects.get(node=nodes[1]).outcome == "open"
    predictions_resolve(now=timezone.now() + timedelta(hours=25))
    assert Prediction.objects.get(node=nodes[1]).outcome == "held"
    figures = prediction_metrics(now=timezone.now() + timedelta(hours=25))
    assert figures["precision"] == 0.5 and figures["recall"] == 0.5 and figures["failures"] == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "role, status",
    [("operator", 200), ("provider-admin", 200), ("tenant-admin", 403), ("tenant-viewer", 403)],
)
def test_prediction_api_and_page_are_for_providers(api, client, users, cluster_with_state, role, status):
    GPUState.objects.filter(node=cluster_with_state[1][0]).update(sbe_rate=5000.0)
    risk_sweep()
    api.as_token(users[role], "read")
    response = api.get("/api/v1/predictions/")
    assert response.status_code == status
    if status == 200:
        row = response.json()["results"][0]
        assert row["score"] > 0.8 and row["cause"] and row["outcome"] == "open"
    client.force_login(users[role])
    page = client.get("/predictions/")
    assert page.status_code == status
    if status == 200:
        assert "n0" in page.content.decode() and "Precision" in page.content.decode()


@pytest.mark.django_db
def test_a_prediction_becomes_a_proactive_migration_for_a_protected_job(tenant_a):
    from jobs.models import RecoveryAction
    from jobs.services.faults import fault_handle
    from tests.support.jobs import protected_cluster, submit

    cluster = protected_cluster(nodes=4, spares=2)
    job = submit(cluster, tenant_a, gpus=16)
    node = job.allocations.filter(released_at__isnull=True).first().node
    now = timezone.now()
    for gpu in node.gpus.all():
        GPUState.objects.create(gpu=gpu, node=node, ts=now, temperature=84.0, temperature_trend=40.0)
    result = risk_sweep()
    prediction = Prediction.objects.get(node=node)
    assert prediction.pk in result.predictions
    fault_handle(fault_id=prediction.fault_id)
    action = RecoveryAction.objects.get(fault_id=prediction.fault_id, job=job)
    assert action.kind == "proactive_migration" and action.to_node is not None and action.to_node != node
    predictions_resolve()
    prediction.refresh_from_db()
    assert prediction.action_taken == "proactive_migration" and prediction.outcome == "open"


@pytest.mark.django_db
def test_the_horizon_follows_the_simulators_time_compression(cluster_with_state, settings):
    from fleet.choices import DriverName
    from telemetry.services.prediction import prediction_horizon_hours

    cluster, nodes = cluster_with_state
    settings.PREDICTION_HORIZON_HOURS, settings.SIMULATOR_ACCELERATION = 24.0, 600.0
    assert cluster.driver == DriverName.SIMULATED and prediction_horizon_hours(cluster) == pytest.approx(0.04)
    cluster.driver = DriverName.KUBERNETES
    assert prediction_horizon_hours(cluster) == 24.0
    GPUState.objects.filter(node=nodes[0]).update(sbe_rate=5000.0)
    risk_sweep()
    assert Prediction.objects.get().horizon_hours * 3600 == pytest.approx(144.0)
    figures = prediction_metrics()
    assert figures["horizon_seconds"] == 144.0 and figures["horizon_fault_model_hours"] == 24.0


def test_chance_figures_are_the_share_of_node_time_a_failure_follows_within_the_horizon():
    from telemetry.services.prediction import chance_figures

    # two nodes over 100 s, a 10 s horizon; node 1 fails at 50 and 55 (covered: 40..55), node 2 at 5 (0..5)
    precision, recall = chance_figures(
        failures={1: [55.0, 50.0], 2: [5.0]},
        nodes=2,
        start=0.0,
        end=100.0,
        horizon_seconds=10.0,
        predictions=4,
    )
    assert precision == pytest.approx((15 + 5) / 200)
    assert recall == pytest.approx(1 - (1 - 0.1 / 2) ** 4)
    assert chance_figures(
        failures={}, nodes=2, start=0.0, end=100.0, horizon_seconds=10.0, predictions=3
    ) == (0.0, None)
    assert chance_figures(
        failures={}, nodes=0, start=0.0, end=100.0, horizon_seconds=10.0, predictions=3
    ) == (None, None)


@pytest.mark.django_db
def test_random_predictions_score_what_chance_says_and_ours_show_their_lift(cluster_with_state, settings):
    """Predictions placed at random on a fleet whose nodes fail at random score about the chance precision;
    a prediction that came true on a fleet where failures are rare shows a lift well over 1."""
    import random

    from telemetry.services.prediction import chance_figures

    rng = random.Random(3)
    span, horizon, nodes = 10_000.0, 100.0, 20
    failures = {n: sorted(rng.uniform(0, span) for _ in range(rng.randint(0, 4))) for n in range(nodes)}
    trials = [(rng.randrange(nodes), rng.uniform(0, span - horizon)) for _ in range(20_000)]
    hits = sum(any(t <= f <= t + horizon for f in failures[n]) for n, t in trials)
    precision, _ = chance_figures(
        failures=failures, nodes=nodes, start=0.0, end=span, horizon_seconds=horizon, predictions=len(trials)
    )
    assert hits / len(trials) == pytest.approx(precision, abs=0.01)

    settings.SIMULATOR_ACCELERATION = 1.0
    cluster, fleet_nodes = cluster_with_state
    GPUState.objects.filter(node=fleet_nodes[0]).update(sbe_rate=5000.0)
    risk_sweep()
    fault_ingest(source="agent", kind="ecc_uncorrectable", node=fleet_nodes[0], gpu_index=1)
    predictions_resolve()
    figures = prediction_metrics()
    assert figures["precision"] == 1.0 and figures["recall"] == 1.0 and figures["failures"] == 1
    assert FaultEvent.objects.filter(kind="ecc_uncorrectable").count() == 1
    assert 0 < figures["chance_precision"] <= 1.0
    assert (
        figures["precision_lift"] == pytest.approx(1.0 / figures["chance_precision"], rel=0.01)
        and figures["precision_lift"] > 1
    )
