"""Prometheus exposition at /metrics: Lockstep's figures read from the database at scrape time.

Reading the database (instead of counting in each process) gives every web process the same answer, needs
no multiprocess mode, and survives restarts. Names follow Prometheus conventions: the ``lockstep_`` prefix,
base units (seconds, so GPU-hours are exposed as GPU-seconds), ``_total`` for counters. A labelled family
lists every value of its choices, 0 where no row has it, so rate() sees a first increase. Lockstep's own health
(outbox, queues, heartbeats, sweeps: controlplane/metrics.py) is served beside these; the alert rules in
deploy/prometheus/rules/ read both.
"""

from datetime import timedelta

from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Min, Q, Sum
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from controlplane.metrics import HealthCollector
from fleet.choices import DriftKind, GPUHealth, NodeState, RolloutState
from fleet.models import GPU, Node
from fleet.models.drift import DriftFinding
from fleet.models.rollouts import Rollout
from jobs.choices import ActionKind, ActionState, FaultKind, FaultState
from jobs.metrics import IncidentWorkCollector
from jobs.models import FaultEvent, RecoveryAction

DECISION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _by(queryset, field: str, choices) -> list[tuple[str, int]]:
    """Counts by ``field``, with every choice present (0 when none): a series that appears only once its first
    row exists would hide that first increase from rate() and increase()."""
    counts = {value: 0 for value in choices.values}
    counts.update(queryset.values_list(field).annotate(n=Count("pk")).order_by(field))
    return sorted(counts.items())


class LockstepCollector:
    def collect(self):
        """Every figure, read from the database at scrape time, in exposition order."""
        yield from self._inventory()
        yield from self._faults_and_actions()
        yield from self._faults_waiting_and_gpu_time()
        yield from self._decision_latency()
        yield from self._rollouts_and_drift()

    def _inventory(self):
        """GPUs by health and nodes by state."""
        gpus = GaugeMetricFamily("lockstep_gpus", "GPUs by health", labels=["health"])
        for health, n in _by(GPU.objects.all(), "health", GPUHealth):
            gpus.add_metric([health], n)
        yield gpus

        nodes = GaugeMetricFamily("lockstep_nodes", "Nodes by state", labels=["state"])
        for state, n in _by(Node.objects.all(), "state", NodeState):
            nodes.add_metric([state], n)
        yield nodes

    def _faults_and_actions(self):
        """Fault events by kind; recovery actions by kind and outcome."""
        faults = CounterMetricFamily("lockstep_faults", "Fault events stored, by kind", labels=["kind"])
        for kind, n in _by(FaultEvent.objects.all(), "kind", FaultKind):
            faults.add_metric([kind], n)
        yield faults

        actions = CounterMetricFamily(
            "lockstep_recovery_actions", "Recovery actions by kind and outcome", labels=["kind", "outcome"]
        )
        rows = {(kind, state): 0 for kind in ActionKind.values for state in ActionState.values}
        rows.update(
            ((kind, state), n)
            for kind, state, n in RecoveryAction.objects.values_list("kind", "state")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for (kind, state), n in sorted(rows.items()):
            actions.add_metric([kind, state], n)
        yield actions

    def _faults_waiting_and_gpu_time(self):
        """The undecided faults (how many, how long the oldest has waited); GPU time saved and lost."""
        waiting = FaultEvent.objects.filter(state=FaultState.NEW).aggregate(
            n=Count("pk"), oldest=Min("received_at")
        )
        yield GaugeMetricFamily(
            "lockstep_faults_waiting", "Faults stored and not yet decided (new)", value=waiting["n"]
        )
        yield GaugeMetricFamily(
            "lockstep_faults_waiting_oldest_seconds",
            "How long the oldest undecided fault has waited (0: none)",
            value=(timezone.now() - waiting["oldest"]).total_seconds() if waiting["oldest"] else 0.0,
        )

        saved = RecoveryAction.objects.filter(state="succeeded").aggregate(
            saved=Sum("gpu_hours_saved"), lost=Sum("gpu_hours_lost")
        )
        yield CounterMetricFamily(
            "lockstep_gpu_seconds_saved",
            "GPU time saved against restart from checkpoint",
            value=(saved["saved"] or 0.0) * 3600,
        )
        yield CounterMetricFamily(
            "lockstep_gpu_seconds_lost",
            "GPU time lost to faults despite recovery",
            value=(saved["lost"] or 0.0) * 3600,
        )

    def _decision_latency(self):
        """From a fault's receipt to its recovery action, as a histogram."""
        latency = ExpressionWrapper(F("planned_at") - F("fault__received_at"), output_field=DurationField())
        decided = RecoveryAction.objects.filter(fault__isnull=False).annotate(latency=latency)
        counts = decided.aggregate(
            total=Count("pk"),
            **{
                f"le_{i}": Count("pk", filter=Q(latency__lte=timedelta(seconds=b)))
                for i, b in enumerate(DECISION_BUCKETS)
            },
        )
        histogram = HistogramMetricFamily(
            "lockstep_fault_to_decision_seconds",
            "From a fault's receipt to its recovery action being recorded",
            buckets=[(str(b), counts[f"le_{i}"]) for i, b in enumerate(DECISION_BUCKETS)]
            + [("+Inf", counts["total"])],
            sum_value=_latency_sum(decided),
        )
        yield histogram

    def _rollouts_and_drift(self):
        """Rollouts by state and open drift findings by kind."""
        rollouts = GaugeMetricFamily("lockstep_rollouts", "Rollouts by state", labels=["state"])
        for state, n in _by(Rollout.objects.all(), "state", RolloutState):
            rollouts.add_metric([state], n)
        yield rollouts

        drift = GaugeMetricFamily(
            "lockstep_drift_findings_open", "Open drift findings by kind", labels=["kind"]
        )
        for kind, n in _by(DriftFinding.objects.filter(resolved_at__isnull=True), "kind", DriftKind):
            drift.add_metric([kind], n)
        yield drift


def _latency_sum(decided) -> float:
    row = decided.aggregate(avg=Avg("latency"), n=Count("pk"))
    return row["avg"].total_seconds() * row["n"] if row["avg"] is not None else 0.0


def exposition() -> bytes:
    registry = CollectorRegistry()
    registry.register(LockstepCollector())
    registry.register(HealthCollector())
    registry.register(IncidentWorkCollector())  # incidents as on-call work (jobs/metrics.py)
    return generate_latest(registry)
