"""The rollout fault-rate gate: did a batch's hardware faults rise after its change, beyond Poisson noise?

Faults on a batch's nodes arrive as a Poisson process. With ``before`` faults in ``before_exposure`` node-hours
before the change and ``after`` in ``after_exposure`` node-hours since, and the same rate in both windows, the
number since the change, given the total ``n = before + after``, is Binomial(n, after_exposure / (after_exposure +
before_exposure)): the exact conditional test of two Poisson counts (Przyborowski and Wilenski, 1940). The gate
fails the batch when the one-sided p-value of ``after`` is below ROLLOUT_GATE_SIGNIFICANCE. It counts only fault
kinds a node-level change can cause (``jobs.choices.NODE_HARDWARE_KINDS``, through ``fleet.hooks.count_faults``),
one per incident, on the batch's own clusters; the window before reaches back ROLLOUT_GATE_BASELINE_HOURS (at
least as long as the batch's own window), clipped per cluster to when Lockstep has known it.
``bench/rollout_gate.py`` measures the false-rollback and detection rates (docs/benchmarks.md).
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count
from scipy.stats import binomtest

from fleet import hooks


def rate_rose_p(after: int, before: int, after_exposure: float, before_exposure: float) -> float:
    """One-sided p-value that the rate since the change is higher than before (1.0 when nothing can be told:
    no fault since the change, or no exposure before it)."""
    if after <= 0 or after_exposure <= 0 or before_exposure <= 0:
        return 1.0
    share = after_exposure / (after_exposure + before_exposure)
    return float(binomtest(after, after + before, share, alternative="greater").pvalue)


@dataclass(frozen=True)
class GateResult:
    after: int
    before: int
    after_node_hours: float
    before_node_hours: float
    p_value: float
    significance: float

    @property
    def failed(self) -> bool:
        return self.p_value < self.significance

    def describe(self) -> str:
        return (
            f"hardware faults {self.after} in {self.after_node_hours:.1f} node-hours since the change, "
            f"{self.before} in {self.before_node_hours:.1f} before (p = {self.p_value:.2g}, "
            f"significance {self.significance:g})"
        )


def node_hours(cluster_ids: list[int], since: datetime, until: datetime) -> float:
    """Node-hours of these clusters' nodes in [since, until), each cluster counted from when it was created."""
    from fleet.models import Cluster

    counts = dict(
        Cluster.objects.filter(pk__in=cluster_ids).annotate(n=Count("nodes")).values_list("pk", "n")
    )
    created = dict(Cluster.objects.filter(pk__in=cluster_ids).values_list("pk", "created_at"))
    total = 0.0
    for cluster_id, nodes in counts.items():
        start = max(since, created[cluster_id])
        if until > start:
            total += nodes * (until - start).total_seconds() / 3600.0
    return total


def fault_gate(
    cluster_ids: list[int],
    started_at: datetime,
    now: datetime,
    *,
    significance: float | None = None,
    baseline_hours: float | None = None,
) -> GateResult:
    """Compare the clusters' hardware faults since ``started_at`` with the window before it."""
    significance = settings.ROLLOUT_GATE_SIGNIFICANCE if significance is None else significance
    baseline_hours = settings.ROLLOUT_GATE_BASELINE_HOURS if baseline_hours is None else baseline_hours
    window = max(now - started_at, timedelta(seconds=1))
    baseline = max(window, timedelta(hours=baseline_hours))
    before_from = started_at - baseline
    after = hooks.count_faults(cluster_ids, started_at, now)
    before = hooks.count_faults(cluster_ids, before_from, started_at)
    after_hours = node_hours(cluster_ids, started_at, now)
    before_hours = node_hours(cluster_ids, before_from, started_at)
    return GateResult(
        after=after,
        before=before,
        after_node_hours=after_hours,
        before_node_hours=before_hours,
        p_value=rate_rose_p(after, before, after_hours, before_hours),
        significance=significance,
    )
