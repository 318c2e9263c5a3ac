"""The risk sweep (beat): score every node from its kept features, record history, raise predictions, and
judge past predictions against what happened.

A node whose score reaches its cluster's threshold gets a Prediction and a ``predicted_failure`` fault, which
the planner turns into a proactive migration and drain within the disruption budgets. A prediction comes
true when a hardware fault strikes the node within its horizon (its lead time is recorded), and is held
otherwise; precision, recall and lead time are computed from these records, beside what predictions made at
random at the same rate would score (docs/prediction.md, *Live figures*).
"""

import logging
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from fleet.choices import DriverName
from fleet.models import Cluster, Node
from fleet.services.hardware import nodes_set_risk
from jobs.choices import ActionKind, ActionState
from jobs.models import FaultEvent, RecoveryAction
from jobs.placement import risk_threshold
from jobs.services.faults import fault_ingest
from telemetry.models import FacilityState, GPUState, NICState, Prediction, RiskSample
from telemetry.prediction import online
from telemetry.prediction.risk import NodeFeatures, RackFacility, Risk, node_risk

log = logging.getLogger(__name__)

# Faults that count as a node failing (a prediction comes true); a prediction's own fault does not.
HARDWARE_FAULTS = (
    "nic_down",
    "link_flap",
    "gpu_xid",
    "ecc_uncorrectable",
    "nvlink_error",
    "node_unreachable",
    "thermal",
    "facility",
)
PRESSURE_METRICS = ("cdu_differential_pressure_pascals", "cdu_supply_pressure_pascals")


@dataclass
class SweepResult:
    nodes: int = 0
    predictions: list[int] = field(default_factory=list)
    resolved: int = 0
    samples: int = 0
    top: list[tuple[int, float, str]] = field(default_factory=list)


def gather(
    cluster_ids: list[int] | None = None, node_ids: list[int] | None = None
) -> tuple[dict[int, NodeFeatures], dict[tuple[int, str], RackFacility], dict]:
    """Features of every node (three aggregate queries) and each rack's facility state (one more); of the
    ``cluster_ids``' nodes only, or of the ``node_ids`` only (with their racks' every node, whose warming the
    facility term averages)."""
    nodes = Node.objects.all() if cluster_ids is None else Node.objects.filter(cluster_id__in=cluster_ids)
    if node_ids is not None:
        racks = Node.objects.filter(pk__in=node_ids).exclude(rack="").values("cluster_id", "rack")
        nodes = nodes.filter(
            Q(pk__in=node_ids) | Q(cluster_id__in=racks.values("cluster_id"), rack__in=racks.values("rack"))
        )
    scoped = cluster_ids is not None or node_ids is not None
    meta = {row[0]: row for row in nodes.values_list("id", "cluster_id", "rack", "risk_score")}
    features = {node_id: NodeFeatures(node_id=node_id, rack=row[2]) for node_id, row in meta.items()}
    gpus = GPUState.objects.filter(node_id__in=meta.keys()) if scoped else GPUState.objects.all()
    for row in (
        gpus.values("node_id")
        .annotate(
            temperature=Max("temperature"),
            trend=Max("temperature_trend"),
            sbe=Max("sbe_rate"),
            remap=Max("remap_rate"),
            nvlink=Max("nvlink_rate"),
            throttle=Max("throttle_share"),
        )
        .order_by()
    ):
        f = features.get(row["node_id"])
        if f is None:
            continue
        f.temperature_max, f.temperature_trend_max = row["temperature"], row["trend"] or 0.0
        f.sbe_rate_max, f.remap_rate_max, f.nvlink_rate_max = (
            row["sbe"] or 0.0,
            row["remap"] or 0.0,
            row["nvlink"] or 0.0,
        )
        f.throttle_share_max = row["throttle"] or 0.0
    nics = NICState.objects.filter(node_id__in=meta.keys()) if scoped else NICState.objects.all()
    for row in (
        nics.values("node_id")
        .annotate(symbols=Max("symbol_rate"), recoveries=Max("recovery_rate"))
        .order_by()
    ):
        f = features.get(row["node_id"])
        if f is not None:
            f.nic_symbol_rate_max, f.nic_recovery_rate_max = row["symbols"] or 0.0, row["recoveries"] or 0.0
    warming: dict[tuple[int, str], list[float]] = defaultdict(list)
    for node_id, f in features.items():
        if f.rack:
            warming[(meta[node_id][1], f.rack)].append(f.temperature_trend_max)
    racks: dict[tuple[int, str], RackFacility] = {}
    facility = FacilityState.objects.filter(scope="rack", metric__in=PRESSURE_METRICS)
    if scoped:
        facility = facility.filter(cluster_id__in={row[1] for row in meta.values()})
    for cluster_id, target, ewma, baseline in facility.values_list(
        "cluster_id", "target", "ewma", "baseline"
    ):
        trends = warming.get((cluster_id, target), [])
        drop = (baseline - ewma) / baseline if baseline else 0.0
        racks[(cluster_id, target)] = RackFacility(
            pressure_drop=max(0.0, drop), warming=statistics.mean(trends) if trends else 0.0
        )
    return features, racks, meta


def _record_history(scores: dict[int, Risk], meta: dict, now) -> int:
    samples = [
        RiskSample(node_id=node_id, ts=now, score=risk.score)
        for node_id, risk in scores.items()
        if risk.score >= 0.05 or abs(risk.score - (meta[node_id][3] or 0.0)) >= 0.02
    ]
    RiskSample.objects.bulk_create(samples, batch_size=5000)
    return len(samples)


def _write_scores(scores: dict[int, Risk], meta: dict, now) -> None:
    nodes_set_risk(
        scores={
            node_id: risk.score
            for node_id, risk in scores.items()
            if abs(risk.score - (meta[node_id][3] or 0.0)) >= 0.001
        },
        at=now,
    )


def prediction_horizon_hours(cluster: Cluster) -> float:
    """How long (wall-clock hours) a prediction on this cluster looks ahead: ``PREDICTION_HORIZON_HOURS`` is in
    the fault model's time, which on a simulated cluster runs ``SIMULATOR_ACCELERATION`` times faster."""
    hours = settings.PREDICTION_HORIZON_HOURS
    if cluster.driver == DriverName.SIMULATED and settings.SIMULATOR_ACCELERATION > 0:
        return hours / settings.SIMULATOR_ACCELERATION
    return hours


def _predict(scores: dict[int, Risk], meta: dict, now, result: SweepResult) -> None:
    clusters = list(Cluster.objects.select_related("blueprint_version"))
    thresholds = {c.pk: risk_threshold(c) for c in clusters}
    horizons = {c.pk: prediction_horizon_hours(c) for c in clusters}
    over = [
        node_id for node_id, risk in scores.items() if risk.score >= thresholds.get(meta[node_id][1], 0.8)
    ]
    if not over:
        return
    already = set(
        Prediction.objects.filter(node_id__in=over, outcome=Prediction.Outcome.OPEN).values_list(
            "node_id", flat=True
        )
    )
    for node_id in over:
        if node_id in already:
            continue
        risk = scores[node_id]
        with transaction.atomic():
            node = Node.objects.select_related("cluster").get(pk=node_id)
            horizon = horizons.get(node.cluster_id) or prediction_horizon_hours(node.cluster)
            prediction = Prediction.objects.create(
                node=node,
                cluster=node.cluster,
                score=risk.score,
                threshold=thresholds.get(node.cluster_id, 0.8),
                horizon_hours=horizon,
                predicted_at=now,
                cause=risk.cause[:300],
                cause_kind=risk.kind,
                evidence=risk.evidence,
            )
            fault, _ = fault_ingest(
                source="predictor",
                kind="predicted_failure",
                node=node,
                detected_at=now,
                details={
                    "prediction": prediction.pk,
                    "score": risk.score,
                    "cause": risk.cause,
                    "horizon_hours": horizon,
                },
            )
            prediction.fault = fault
            prediction.save(update_fields=["fault"])
        result.predictions.append(prediction.pk)


def predictions_resolve(*, now=None) -> int:
    """Judge open predictions: true when a hardware fault struck the node within the horizon, held when the
    horizon passed without one. Also records what was done about each (the planner's action)."""
    now = now or timezone.now()
    resolved = 0
    for prediction in Prediction.objects.filter(outcome=Prediction.Outcome.OPEN).select_related("fault"):
        end = prediction.predicted_at + timedelta(hours=prediction.horizon_hours)
        failure = (
            FaultEvent.objects.filter(
                node_id=prediction.node_id,
                kind__in=HARDWARE_FAULTS,
                detected_at__gte=prediction.predicted_at,
                detected_at__lte=min(end, now),
            )
            .order_by("detected_at")
            .first()
        )
        if not prediction.action_taken and prediction.fault_id:
            kind = (
                RecoveryAction.objects.filter(fault_id=prediction.fault_id)
                .values_list("kind", flat=True)
                .first()
            )
            prediction.action_taken = kind or ""
        if failure is not None:
            prediction.outcome, prediction.failure = Prediction.Outcome.FAILED, failure
            prediction.lead_seconds = (failure.detected_at - prediction.predicted_at).total_seconds()
        elif now >= end:
            prediction.outcome = Prediction.Outcome.HELD
        else:
            if prediction.action_taken:
                prediction.save(update_fields=["action_taken"])
            continue
        prediction.outcome_at = now
        prediction.save(update_fields=["outcome", "failure", "lead_seconds", "outcome_at", "action_taken"])
        resolved += 1
    return resolved


def risk_sweep(
    *, cluster_ids: list[int] | None = None, node_ids: list[int] | None = None, now=None
) -> SweepResult:
    """Score every node (its kept features, and its streaming detectors' alarms), record history, raise
    predictions over the threshold, judge past ones. ``node_ids``: score only these (and their racks' nodes),
    whose features just changed: every other node's score stands as the last sweep left it."""
    now = now or timezone.now()
    features, racks, meta = gather(cluster_ids, node_ids)
    try:  # the anomaly term: each node's series through its streaming detector (state kept in Redis)
        online.observe(features, now.timestamp(), prune=cluster_ids is None and node_ids is None)
    except redis.RedisError as error:  # without Redis the other evidence still scores every node
        log.warning("risk sweep without the anomaly term: %s", error)
    scores = {node_id: node_risk(f, racks.get((meta[node_id][1], f.rack))) for node_id, f in features.items()}
    result = SweepResult(nodes=len(scores))
    with transaction.atomic():
        result.samples = _record_history(scores, meta, now)
        _write_scores(scores, meta, now)
    _predict(scores, meta, now, result)
    result.resolved = predictions_resolve(now=now)
    result.top = sorted(((n, r.score, r.cause) for n, r in scores.items()), key=lambda item: -item[1])[:10]
    return result


def emptied_before_failure(predictions) -> set[int]:
    """Of these predictions, the ids of those that came true after their proactive migration had emptied the node
    (the move was in time: a true prediction, not a false alarm). Two queries, however many predictions."""
    came_true = {
        p.pk: p for p in predictions if p.outcome == Prediction.Outcome.FAILED and p.fault_id and p.failure_id
    }
    if not came_true:
        return set()
    failed_at = dict(
        FaultEvent.objects.filter(pk__in=[p.failure_id for p in came_true.values()]).values_list(
            "pk", "detected_at"
        )
    )
    moved = defaultdict(list)
    for fault_id, ended_at in RecoveryAction.objects.filter(
        fault_id__in=[p.fault_id for p in came_true.values()],
        kind=ActionKind.PROACTIVE_MIGRATION,
        state=ActionState.SUCCEEDED,
        ended_at__isnull=False,
    ).values_list("fault_id", "ended_at"):
        moved[fault_id].append(ended_at)
    return {
        pk
        for pk, p in came_true.items()
        if any(ended <= failed_at.get(p.failure_id, ended) for ended in moved.get(p.fault_id, []))
    }


def chance_figures(
    *,
    failures: dict[int, list[float]],
    nodes: int,
    start: float,
    end: float,
    horizon_seconds: float,
    predictions: int,
) -> tuple[float | None, float | None]:
    """(precision, recall) that ``predictions`` made on nodes and at moments chosen at random over [start, end]
    would be expected to score, each looking ``horizon_seconds`` ahead (docs/prediction.md, *Live figures*).

    A random prediction comes true when its node fails within the horizon after it: the chance is the share of
    node-time from which a failure lies within the horizon ahead. A failure is caught when at least one random
    prediction lands on its node within the horizon before it."""
    span = end - start
    if nodes <= 0 or span <= 0 or horizon_seconds <= 0:
        return None, None
    covered = 0.0
    for times in failures.values():
        reach = start
        for t in sorted(times):
            low, high = max(reach, t - horizon_seconds, start), min(t, end)
            if high > low:
                covered += high - low
            reach = max(reach, high)
    precision = covered / (nodes * span)
    count = sum(len(times) for times in failures.values())
    hit = min(1.0, horizon_seconds / span) / nodes
    recall = 1.0 - (1.0 - hit) ** predictions if count else None
    return precision, recall


def prediction_metrics(*, since_days: float = 30.0, now=None) -> dict:
    """Live precision, recall and lead time of past predictions (over ``since_days``), beside what random
    predictions at the same rate would score (the lift over chance), and the horizon they were judged on."""
    now = now or timezone.now()
    since = now - timedelta(days=since_days)
    judged = list(Prediction.objects.filter(predicted_at__gte=since).exclude(outcome=Prediction.Outcome.OPEN))
    came_true = [p for p in judged if p.outcome == Prediction.Outcome.FAILED]
    # a failure is an incident (every report of one node failing: an Xid and the ECC count behind it are one)
    failures: dict[object, tuple[int, float]] = {}
    for pk, incident_id, node_id, at in (
        FaultEvent.objects.filter(kind__in=HARDWARE_FAULTS, detected_at__gte=since, detected_at__lte=now)
        .order_by("detected_at")
        .values_list("pk", "incident_id", "node_id", "detected_at")
    ):
        failures.setdefault(incident_id or f"fault-{pk}", (node_id, at.timestamp()))
    foreseen = set(
        FaultEvent.objects.filter(pk__in=[p.failure_id for p in came_true if p.failure_id]).values_list(
            "pk", "incident_id"
        )
    )
    predicted_failures = len({incident_id or f"fault-{pk}" for pk, incident_id in foreseen} & failures.keys())
    total_failures = len(failures)
    leads = [p.lead_seconds for p in came_true if p.lead_seconds is not None]
    judged_count, true_count = len(judged), len(came_true)
    precision = true_count / judged_count if judged_count else None
    recall = predicted_failures / total_failures if total_failures else None
    horizons = (
        [p.horizon_hours for p in judged]
        or [prediction_horizon_hours(c) for c in Cluster.objects.all()[:1]]
        or [settings.PREDICTION_HORIZON_HOURS]
    )
    horizon_seconds = statistics.median(horizons) * 3600.0
    first = (
        Prediction.objects.filter(predicted_at__gte=since)
        .order_by("predicted_at")
        .values_list("predicted_at", flat=True)
        .first()
    )
    start = max(since, first or now)
    by_node: dict[int, list[float]] = defaultdict(list)
    for node_id, at in failures.values():
        by_node[node_id].append(at)
    chance_precision, chance_recall = chance_figures(
        failures=by_node,
        nodes=Node.objects.count(),
        start=start.timestamp(),
        end=now.timestamp(),
        horizon_seconds=horizon_seconds,
        predictions=judged_count,
    )

    def lift(value, chance):
        return round(value / chance, 2) if value is not None and chance else None

    return {
        "predictions": Prediction.objects.filter(predicted_at__gte=since).count(),
        "judged": judged_count,
        "precision": round(precision, 3) if precision is not None else None,
        "recall": round(recall, 3) if recall is not None else None,
        "failures": total_failures,
        "emptied": len(emptied_before_failure(came_true)),
        "lead_time_median_seconds": round(statistics.median(leads), 1) if leads else None,
        "horizon_seconds": round(horizon_seconds, 1),
        "horizon_fault_model_hours": settings.PREDICTION_HORIZON_HOURS,
        "chance_precision": round(chance_precision, 3) if chance_precision is not None else None,
        "chance_recall": round(chance_recall, 3) if chance_recall is not None else None,
        "precision_lift": lift(precision, chance_precision),
        "recall_lift": lift(recall, chance_recall),
    }


def precision_in_band(score: float) -> tuple[float, int, str] | None:
    """jobs.hooks precision provider: the share of judged predictions with a score in ``score``'s band (tenths)
    that came true, how many were judged, and the band in words; None when none was judged."""
    low = min(0.9, math.floor(max(0.0, score) * 10) / 10)
    judged = Prediction.objects.exclude(outcome=Prediction.Outcome.OPEN).filter(score__gte=low)
    if low < 0.9:
        judged = judged.filter(score__lt=low + 0.1)
    counts = judged.aggregate(n=Count("id"), true=Count("id", filter=Q(outcome=Prediction.Outcome.FAILED)))
    if not counts["n"]:
        return None
    return counts["true"] / counts["n"], counts["n"], f"{low:.1f}–{min(1.0, low + 0.1):.1f}"
