"""The world a real-path replay plays around the product (``simulator.replay``): where each strike lands and what
it takes with it (lemon nodes, racks, leaves), the precursors that show before some strikes, the operator's
repairs, and links coming back. Each world queue keeps a heap of ``(when, …)`` events and runs the next one on the
virtual clock (``run_next``); the replay interleaves them with beat's steps in time order.
"""

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from simulator.whatif import WhatIfConfig

START = datetime(2026, 1, 5, tzinfo=UTC)  # the virtual clock's origin: any fixed moment does


def report_of(strike, job, rank: int | None = None) -> dict | None:
    """The fault report a strike makes, on the node that holds its GPU's rank now (or ``rank``: a lemon's), None
    when the job holds none."""
    from jobs.models import JobAllocation

    rank = strike.gpu if rank is None else rank
    allocation = (
        JobAllocation.objects.filter(
            job=job, released_at__isnull=True, rank_start__lte=rank, rank_end__gte=rank
        )
        .select_related("node")
        .first()
    )
    if allocation is None:
        return None
    report = {"kind": strike.kind, "node": allocation.node}
    if strike.kind == "gpu_xid":
        report |= {"xid": strike.xid or 79, "gpu_index": rank % 8}
    elif strike.kind in ("ecc_uncorrectable", "nvlink_error", "thermal"):
        report |= {"gpu_index": rank % 8}
    elif strike.kind in ("nic_down", "link_flap", "link_degraded"):
        report |= {"nic_name": f"mlx5_{rank % 8}"}
    return report


@dataclass
class Lemons:
    """Lemon nodes, as the formula replay has them: ``lemon_node_share`` of the nodes (drawn node by node, job
    nodes then spares, from the formula's own seeded draws) take ``lemon_fault_share`` of the hardware faults that
    strike while the job holds one; the operator replaces a lemon that has failed ``lemon_retire_after`` times
    with a sound node when it repairs it (``Repairs``). Where a lemon is, the product does not know: it sees the
    faults."""

    ids: set
    share: float
    retire_after: int
    failures: Counter = field(default_factory=Counter)
    nodes: int = 0
    hardware: int = 0
    on_lemons: int = 0
    retired: int = 0

    @classmethod
    def of(cls, cluster, config: WhatIfConfig) -> "Lemons":
        from fleet.models import Node

        draws = random.Random(f"lemons-{config.seed}")
        pks = Node.objects.filter(cluster=cluster).order_by("hostname").values_list("pk", flat=True)
        ids = {pk for pk in pks if draws.random() < config.lemon_node_share}
        return cls(ids, config.lemon_fault_share, config.lemon_retire_after, nodes=len(ids))

    def rank_hit(self, strike, draw, job) -> int | None:
        """The rank a hardware strike hits on a lemon the job holds (the draw picks which), else None."""
        from jobs.models import JobAllocation
        from simulator.profiles import SOFTWARE_COMPONENTS

        if strike.component in SOFTWARE_COMPONENTS:
            return None
        self.hardware += 1
        if not self.ids or draw.lemon >= self.share:
            return None
        held = list(
            JobAllocation.objects.filter(job=job, released_at__isnull=True, node_id__in=self.ids)
            .order_by("rank_start")
            .values_list("rank_start", flat=True)
        )
        if not held:
            return None
        return held[min(len(held) - 1, int(draw.slot * len(held)))] + strike.gpu % 8

    def struck(self, strike, node_id: int, down: list[int]) -> None:
        """A hardware strike on ``node_id`` (``down``: the nodes that failed with it, a rack's): each counts a
        failure toward the lemon's replacement."""
        from simulator.profiles import SOFTWARE_COMPONENTS

        if strike.component in SOFTWARE_COMPONENTS:
            return
        self.on_lemons += node_id in self.ids
        self.failures.update({node_id, *down})

    def repaired(self, node_id: int) -> None:
        if node_id in self.ids and self.failures[node_id] >= self.retire_after:
            # found out: the lemon goes back to its vendor and a sound node takes its place
            self.ids.discard(node_id)
            self.failures[node_id] = 0
            self.retired += 1

    def report(self) -> dict:
        return {
            "lemon_nodes": self.nodes,
            "hardware_faults": self.hardware,
            "hardware_faults_on_lemon_nodes": round(self.on_lemons / self.hardware, 4)
            if self.hardware
            else 0.0,
            "lemons_retired": self.retired,
        }


def target(strike, draw, job, lemons: Lemons | None = None) -> dict | None:
    """The report of the node a strike hits: the one that holds its rank now, or with the formula replay's own draw
    a lemon the job holds (at ``lemon_fault_share``). None when the job holds no node for it."""
    return report_of(strike, job, lemons.rank_hit(strike, draw, job) if lemons else None)


def reports_of(
    strike, draw, job, config: WhatIfConfig, lemons: Lemons | None = None, report: dict | None = None
) -> tuple[list[dict], str]:
    """The reports a strike makes and its scope: with the formula replay's own draw (the same strikes are
    correlated in both), a hardware fault lands on a lemon the job holds at ``lemon_fault_share`` (``lemons``),
    a node-level fault takes its whole rack ("rack": each of the rack's nodes unreachable) and a switch or cable
    fault its leaf ("leaf": the same rail NIC down on each node under the switch); else the one report ("node").
    ``report``: the struck node's, found earlier (``target``: a precursor warned of that node). Empty when the job
    holds no node for the strike's rank."""
    from fleet.models import Node
    from simulator.profiles import LEAF_COMPONENTS, RACK_COMPONENTS

    report = report or target(strike, draw, job, lemons)
    if report is None:
        return [], "node"
    node = report["node"]
    reports, scope = [report], "node"
    if strike.component in RACK_COMPONENTS and draw.scope < config.rack_failure_share:
        peers = Node.objects.filter(cluster_id=node.cluster_id, rack=node.rack).order_by("pk")
        reports, scope = [{"kind": "node_unreachable", "node": peer} for peer in peers], "rack"
    elif (
        strike.component in LEAF_COMPONENTS
        and draw.scope < config.leaf_failure_share
        and report.get("nic_name")
    ):
        peers = Node.objects.filter(cluster_id=node.cluster_id, leaf_switch=node.leaf_switch).order_by("pk")
        reports, scope = [report | {"node": peer} for peer in peers], "leaf"
    if lemons:
        lemons.struck(strike, node.pk, [r["node"].pk for r in reports] if scope == "rack" else [])
    return reports, scope


# A precursor shows on its node this long before its strike: the median lead the live demo measured for its
# predictions (83 s of wall clock at 600×, about 14 h of the fault model's time; docs/prediction.md).
PRECURSOR_LEAD_HOURS = 14.0
# What a precursor leaves in the features ingest keeps from the agent's readings, at the strength the simulator's
# own precursors (simulator.runner.Runner._precursors) reach, over their window of PRECURSOR_SECONDS × 600 (30 h)
# of the fault model's time: corrected ECC errors rising by 5-40 a 10-second report; a GPU warming 25 °C over the
# window; 2,000 symbol errors a report on one port; a rack's cooling loop losing 35 % of its pressure.
PRECURSOR_EVIDENCE = {
    "ecc": {"sbe_rate": 22.5 * 360},  # corrected errors per hour
    "thermal": {"temperature": 60.0 + 25.0, "temperature_trend": 25.0 / 30.0},  # °C, °C per hour
    "nic": {"symbol_rate": 2000.0 * 360},  # symbol errors per hour
    "facility": {"pressure_drop": 0.35},
}


@dataclass
class Precursors:
    """The fault model's precursors through the product's own risk sweep: a strike that has one (the trace's
    ``precursor``) shows its evidence on the node it will hit PRECURSOR_LEAD_HOURS before it (written where ingest
    keeps the agent's features: the GPU's or the port's rates, the rack's cooling loop); the sweep
    (``risk_sweep``) scores the nodes, and a node at its cluster's threshold gets a prediction and a
    ``predicted_failure`` fault, which the planner answers (a proactive migration, within the budgets). The strike
    then hits the node it warned of, whether the job is still there or not. The streaming detectors' anomaly term is
    off here (it learns a node's telemetry for a day, which the replay does not write). At the strike the node's
    evidence ends (its features clean, its score 0) and the open predictions are judged."""

    cluster: object
    job: object
    strikes: list
    draws: list
    lemons: Lemons | None
    due: list = field(default_factory=list)  # heap of (onset, strike index)
    targets: dict = field(default_factory=dict)  # strike index -> the struck node's report, found at onset
    shown: int = 0

    def __post_init__(self):
        for n, strike in enumerate(self.strikes):
            if strike.precursor:
                onset = START + timedelta(hours=max(0.0, strike.at_hours - PRECURSOR_LEAD_HOURS))
                heapq.heappush(self.due, (onset, n))

    def run_next(self, clock) -> None:
        from telemetry.services.prediction import risk_sweep

        at, n = heapq.heappop(self.due)
        clock.move_to(at)
        strike = self.strikes[n]
        report = target(strike, self.draws[n], self.job, self.lemons)
        if report is None:
            return
        self.targets[n] = report
        self._evidence(strike.precursor, report["node"], strike.gpu % 8, on=True)
        self.shown += 1
        # the sweep scores the node whose features changed (every other node's score stands)
        risk_sweep(cluster_ids=[self.cluster.pk], node_ids=[report["node"].pk], now=at)

    def struck(self, n: int) -> None:
        """Strike ``n`` hit: its precursor's evidence ends with it, and the open predictions are judged."""
        from django.utils import timezone

        from fleet.services.hardware import nodes_set_risk
        from telemetry.services.prediction import predictions_resolve

        report = self.targets.get(n)
        if report is None:
            return
        self._evidence(self.strikes[n].precursor, report["node"], self.strikes[n].gpu % 8, on=False)
        nodes_set_risk(scores={report["node"].pk: 0.0}, at=timezone.now())
        predictions_resolve(now=timezone.now())

    def _evidence(self, kind: str, node, index: int, *, on: bool) -> None:
        from django.utils import timezone

        from fleet.models import GPU, NIC
        from telemetry.models import FacilityState, GPUState, NICState

        values = PRECURSOR_EVIDENCE[kind] if on else dict.fromkeys(PRECURSOR_EVIDENCE[kind], 0.0)
        now = timezone.now()
        if kind in ("ecc", "thermal"):
            gpu = GPU.objects.get(node=node, index=index)
            if kind == "thermal" and not on:
                values = {"temperature": 60.0, "temperature_trend": 0.0}
            GPUState.objects.update_or_create(gpu=gpu, defaults={"node": node, "ts": now, **values})
        elif kind == "nic":
            nic = NIC.objects.get(node=node, name=f"mlx5_{index}")  # the port the strike takes down
            NICState.objects.update_or_create(
                nic=nic, defaults={"node": node, "ts": now, "link_state": "up", **values}
            )
        else:
            baseline = 180_000.0
            pressure = baseline * (1.0 - values["pressure_drop"])
            FacilityState.objects.update_or_create(
                cluster_id=node.cluster_id,
                scope="rack",
                target=node.rack,
                series=f"cdu-{node.rack}|loop|cdu_differential_pressure_pascals",
                defaults={
                    "metric": "cdu_differential_pressure_pascals",
                    "ts": now,
                    "value": pressure,
                    "ewma": pressure,
                    "baseline": baseline,
                },
            )

    def report(self) -> dict:
        from telemetry.models import Prediction

        predictions = Prediction.objects.filter(cluster=self.cluster)
        outcomes = Counter(predictions.values_list("outcome", flat=True))
        return {
            "precursors": sum(1 for strike in self.strikes if strike.precursor),
            "precursors_shown": self.shown,
            "predictions": predictions.count(),
            "predictions_came_true": outcomes.get(Prediction.Outcome.FAILED, 0),
            "predictions_held": outcomes.get(Prediction.Outcome.HELD, 0),
            "predictions_open": outcomes.get(Prediction.Outcome.OPEN, 0),
            "precursor_lead_hours": PRECURSOR_LEAD_HOURS,
        }


@dataclass
class Repairs:
    """The operator: a node whose ladder waits for a repair is repaired after an exponential time of mean ``hours``
    through ``escalation_repaired``; the ladder then checks it and returns it to the spare pool."""

    cluster: object
    hours: float
    seed: int
    lemons: Lemons | None = None
    due: list = field(default_factory=list)  # heap of (when, node id)
    waiting: set = field(default_factory=set)
    done: int = 0

    def __post_init__(self):
        self.random = random.Random(f"real-path-repairs-{self.seed}")

    def schedule(self, now: datetime) -> None:
        from jobs.models import NodeEscalation

        failed = NodeEscalation.objects.filter(node__cluster=self.cluster, stage="failed")
        for node_id in set(failed.values_list("node_id", flat=True)) - self.waiting:
            self.waiting.add(node_id)
            hours = -math.log(1.0 - self.random.random()) * self.hours
            heapq.heappush(self.due, (now + timedelta(hours=hours), node_id))

    def run_next(self, clock) -> None:
        from django.db import transaction

        from fleet.models import Node
        from jobs.services.escalation import escalation_repaired

        at, node_id = heapq.heappop(self.due)
        self.waiting.discard(node_id)
        clock.move_to(at)
        with transaction.atomic():
            escalation_repaired(actor=None, node=Node.objects.get(pk=node_id), reason="replayed repair")
        if self.lemons:
            self.lemons.repaired(node_id)
        self.done += 1


@dataclass
class Links:
    """A downed link comes back after the planner's own assumption; beat's failback then ends the degraded
    stretch once the link has been clean for LINK_CLEAN_SECONDS."""

    cluster: object
    due: list = field(default_factory=list)  # heap of (when, 0 up / 1 fail back, node id, NIC)
    failed_back: int = 0

    def schedule(self, at: datetime, report: dict) -> None:
        from jobs.planner import Estimates

        if report.get("nic_name"):
            up = at + timedelta(seconds=Estimates().nic_degraded_seconds)
            heapq.heappush(self.due, (up, 0, report["node"].pk, report["nic_name"]))

    def run_next(self, clock) -> None:
        from django.conf import settings

        from fleet.services.hardware import nic_links_set
        from jobs.services.links import links_fail_back

        at, order, node_id, nic = heapq.heappop(self.due)
        clock.move_to(at)
        if order == 0:
            nic_links_set(links=[(node_id, nic)], state="up")
            back = at + timedelta(seconds=settings.LINK_CLEAN_SECONDS + 1)
            heapq.heappush(self.due, (back, 1, node_id, nic))
        else:
            self.failed_back += links_fail_back()
