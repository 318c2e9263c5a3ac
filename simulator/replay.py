"""The what-if's interruptions through the product's own services, on a virtual clock, in a scratch store.

``manage.py simulate what-if --real-path`` adds this run to the what-if's report (issue 20). The formula replay
(``simulator.whatif``) calls the planner's pure functions; this one feeds the same sampled interruptions (the same
``FaultSampler``, profile and seed) to the running product's code: fault intake and its incident, the decision
(placement, budgets, the escalation ladder), the simulated driver's operations with their durations, beat's
recovery step, failback, the ledger. It builds one protected cluster (the job's nodes and ``spare_fraction`` spares,
16 nodes a leaf) and one job on all of it, then for each strike in turn moves the clock to it (``time-machine``:
every ``timezone.now()`` of the product reads it), reports it through ``fault_ingest_many`` (the decision runs
in-process) and moves the clock to each due step, running ``recovery_advance``, until nothing is planned or running.
It uses the formula replay's own per-strike draws, so the same strikes are correlated in both: a node-level fault
takes its whole rack at ``rack_failure_share`` (each of the rack's 8 nodes reported unreachable at once), a switch or
cable fault its leaf at ``leaf_failure_share`` (the same rail NIC down on each of its 16 nodes). The simulated driver
fails ``failed_recovery_share`` of the recovery operations partway (``recovery_failure_probability``, seeded), and the
product falls back as it would live.

Between strikes it plays the two parts the product leaves to the world: a node whose ladder waits for a repair is
repaired after an exponential time of mean ``repair_hours`` (the formula replay's assumption) through
``escalation_repaired``, after which the ladder checks it and returns it to the spare pool; and a downed NIC comes
back after the planner's own assumption (``Estimates.nic_degraded_seconds``), after which beat's failback ends the
degraded stretch.

It runs only in a process on the scratch settings (``simulator.replay_settings``: an in-memory SQLite database,
an in-process channel layer and cache, Celery eager), which ``run_in_scratch`` starts; ``replay_real_path`` refuses
anything else, so it cannot write to the live fleet. Lemon nodes are the formula's (``_Lemons``: the same share of
nodes takes the same share of hardware faults, and the operator replaces one found out on its repair). Not
modelled yet: predictions from precursors (the formula replay has none either), checkpoint-write stalls (booked
here with the formula's assumption) and the unprotected run (still the formula's). ``simulator.replay_sensitivity``
builds the sensitivity table on this run.
"""

import heapq
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from simulator.whatif import WhatIfConfig, strike_draws, trace

START = datetime(2026, 1, 5, tzinfo=UTC)  # the virtual clock's origin: any fixed moment does
STEPS_PER_RECOVERY = 100  # beat steps per fault after which a recovery that has not ended is counted as such
IDLE_BEATS = 10  # beat steps with nothing due after which a recovery waits for the world
# What beat counts that can make a next step possible: an action completed, started or failed (its fallback), a
# ladder's step. An incident resolved, a saving settled or a snapshot finished cannot, so a beat that did only
# those is not followed by another at once.
RECOVERY_STEPS = ("completed", "started", "failed", "ladder")
ROOT = Path(__file__).resolve().parent.parent


class NotScratch(RuntimeError):
    """The real-path replay writes what a fleet would: it runs only on the scratch settings."""


def _require_scratch() -> None:
    from django.conf import settings
    from django.db import connection

    if not getattr(settings, "SCRATCH_REPLAY", False) or connection.settings_dict["NAME"] != ":memory:":
        raise NotScratch(
            "the real-path replay runs only on simulator.replay_settings (run_in_scratch starts one)"
        )


_SCHEMA = []  # the migrated, empty scratch database, copied for each later replay of the process


def _schema_file() -> Path:
    """Where the migrated, empty scratch database is kept between processes: named by a digest of every
    installed app's migrations and Django's version, so a changed migration makes a new one."""
    import hashlib
    import tempfile

    import django
    from django.apps import apps

    digest = hashlib.sha256(django.__version__.encode())
    for app in sorted(apps.get_app_configs(), key=lambda app: app.label):
        for migration in sorted((Path(app.path) / "migrations").glob("*.py")):
            digest.update(f"{app.label}/{migration.name}".encode())
            digest.update(migration.read_bytes())
    return Path(tempfile.gettempdir()) / f"lockstep-replay-schema-{digest.hexdigest()[:16]}.sqlite3"


def _fresh_store() -> None:
    """An empty scratch store with the product's schema. The first replay of a process copies it from the schema
    file (SQLite's backup API), migrating and writing that first when there is none; each later one copies it
    back over what the last replay left, and forgets what the process kept beside the database (the cache, the
    simulated driver's seeded failure draws)."""
    import sqlite3

    from django.contrib.contenttypes.models import ContentType
    from django.core.cache import cache
    from django.core.management import call_command
    from django.db import connection

    from fleet.drivers.simulated import forget_failure_draws

    connection.ensure_connection()
    if not _SCHEMA:
        _SCHEMA.append(sqlite3.connect(":memory:"))
        path = _schema_file()
        if path.exists():
            with sqlite3.connect(path) as kept:
                kept.backup(_SCHEMA[0])
        else:
            call_command("migrate", verbosity=0)
            connection.connection.backup(_SCHEMA[0])
            written = path.with_suffix(f".{os.getpid()}.tmp")
            with sqlite3.connect(written) as copy:
                _SCHEMA[0].backup(copy)
            written.replace(path)  # whole or not at all, should two processes write it at once
    _SCHEMA[0].backup(connection.connection)
    cache.clear()
    ContentType.objects.clear_cache()
    forget_failure_draws()


def _world(config: WhatIfConfig, connection: dict | None = None):
    """One protected cluster with the job's nodes and its spares, and the job on all of it. ``connection``
    overrides the simulated driver's settings (operation durations)."""
    from django.db import transaction

    from fleet.models import Cluster
    from fleet.services.clusters import cluster_create, fleet_create
    from fleet.services.drift import drift_sweep
    from jobs.services.jobs import job_submit
    from simulator.world import _hardware, _install, _resilient_blueprint, _service_user
    from tenancy.services import tenant_create

    nodes = config.gpus // 8
    with transaction.atomic():
        actor = _service_user()
        tenant = tenant_create(actor=actor, name="What-if", slug="what-if", tier="resilient")
        fleet = fleet_create(actor=actor, name="what-if", description="the real-path replay's fleet")
        blueprint = _resilient_blueprint(actor)
        cluster = cluster_create(
            actor=actor,
            fleet=fleet,
            name="what-if",
            region="what-if",
            kind="kubernetes",
            driver="simulated",
            connection={
                "apply_seconds": 0,
                "migration_pause_seconds": config.migration_pause_seconds,
                "restart_seconds": config.restart_overhead_minutes * 60,
                # the formula's failed-recovery share: a recovery operation fails partway, and the planner goes on
                "recovery_failure_probability": config.failed_recovery_share,
                "recovery_failure_seed": config.seed,
                **(connection or {}),
            },
        )
        Cluster.objects.filter(pk=cluster.pk).update(
            blueprint=blueprint, blueprint_version=blueprint.versions.get(number=1)
        )
        cluster.refresh_from_db()
        _hardware(cluster, "H100", nodes, max(1, int(nodes * config.spare_fraction)))
        _install(cluster)
    drift_sweep(cluster_ids=[cluster.pk])
    job, _ = job_submit(
        actor=actor,
        tenant=tenant,
        cluster=cluster,
        name="training-run",
        gpus=config.gpus,
        checkpoint_interval=max(1, round(config.checkpoint_minutes * 60 / 2.0)),
        seconds_per_iteration=2.0,
        total_iterations=10**9,
    )
    return cluster, job


def _report_of(strike, job, rank: int | None = None) -> dict | None:
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
class _Lemons:
    """Lemon nodes, as the formula replay has them: ``lemon_node_share`` of the nodes (drawn node by node, job
    nodes then spares, from the formula's own seeded draws) take ``lemon_fault_share`` of the hardware faults that
    strike while the job holds one; the operator replaces a lemon that has failed ``lemon_retire_after`` times
    with a sound node when it repairs it (``_Repairs``). Where a lemon is, the product does not know: it sees the
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
    def of(cls, cluster, config: WhatIfConfig) -> "_Lemons":
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


def _target(strike, draw, job, lemons: _Lemons | None = None) -> dict | None:
    """The report of the node a strike hits: the one that holds its rank now, or with the formula replay's own draw
    a lemon the job holds (at ``lemon_fault_share``). None when the job holds no node for it."""
    return _report_of(strike, job, lemons.rank_hit(strike, draw, job) if lemons else None)


def _reports_of(
    strike, draw, job, config: WhatIfConfig, lemons: _Lemons | None = None, report: dict | None = None
) -> tuple[list[dict], str]:
    """The reports a strike makes and its scope: with the formula replay's own draw (the same strikes are
    correlated in both), a hardware fault lands on a lemon the job holds at ``lemon_fault_share`` (``lemons``),
    a node-level fault takes its whole rack ("rack": each of the rack's nodes unreachable) and a switch or cable
    fault its leaf ("leaf": the same rail NIC down on each node under the switch); else the one report ("node").
    ``report``: the struck node's, found earlier (``_target``: a precursor warned of that node). Empty when the job
    holds no node for the strike's rank."""
    from fleet.models import Node
    from simulator.profiles import LEAF_COMPONENTS, RACK_COMPONENTS

    report = report or _target(strike, draw, job, lemons)
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


def _recover(clock, cluster, faults: int = 1, until: datetime | None = None, world=None) -> str:
    """Beat's recovery step, each time with the clock moved to the next moment something is due, until nothing is
    planned or running and no escalation ladder is open, or the next step would fall after ``until`` (the world's
    next event: a repair, a link coming back, the next strike). Due: a running step's end or deadline, a waiting
    one's retry, a ladder's remediation, a simulated operation's end (a health check, a reset). Returns how it
    ended: "ended", "waiting" (for the world: its next event comes first, or nothing more is due and it goes on when
    the world brings something, a repaired spare) or "unended" (still changing after STEPS_PER_RECOVERY steps that
    changed something, for each of its ``faults``). With ``world`` (the repairs and links), a ladder that reaches
    its repair has the repair scheduled at once, and the step stops before the world's first event too."""
    from django.conf import settings
    from django.utils import timezone

    from fleet.models import SimulatedOperation
    from jobs.models import NodeEscalation, RecoveryAction
    from jobs.services.advance import recovery_advance
    from jobs.services.escalation import OPEN_STAGES

    pending = RecoveryAction.objects.filter(cluster=cluster, state__in=("planned", "running"))
    ladders = NodeEscalation.objects.filter(node__cluster=cluster, stage__in=OPEN_STAGES)

    def busy() -> bool:
        return pending.exists() or ladders.exists()

    def next_due():
        """The earliest moment after now that something is due: a running action's end or deadline, a planned
        one's retry, a ladder's or a simulated operation's end. None when nothing has a time ahead. (A time
        already past is not due: the beat at or after it has run, and what still waits, waits for something
        else.)"""
        now = timezone.now()
        times = [
            t
            for state, done_at, deadline_at, retry_at in pending.values_list(
                "state", "done_at", "deadline_at", "retry_at"
            )
            for t in ((done_at, deadline_at) if state == "running" else (retry_at, deadline_at))
        ]
        times += ladders.values_list("done_at", flat=True)
        times += SimulatedOperation.objects.filter(cluster=cluster, done_at__gt=now).values_list(
            "done_at", flat=True
        )
        return min((t for t in times if t and t > now), default=None)

    beat, idle, moved = settings.CELERY_BEAT_SCHEDULE["jobs-recovery-advance"]["schedule"], 0, True
    changes = 0
    while busy():
        # Beat is level-triggered: after a step that moved a recovery on (RECOVERY_STEPS), the next one may take
        # the step it made possible (a ladder blocked by a cap another freed), so it comes one beat later. After a
        # step that moved nothing, nothing changes until the next moment something is due: the clock moves there.
        due = None
        if moved:
            idle = 0
            changes += 1
            if changes > STEPS_PER_RECOVERY * faults:
                return "unended"
        elif (due := next_due()) is None:
            # nothing has a time of its own: beat's next step; after IDLE_BEATS of them that change nothing it
            # waits for the world (a repaired spare) and goes on when it comes
            idle += 1
            if idle > IDLE_BEATS:
                return "waiting"
        at = max(due or timezone.now(), timezone.now() + beat)
        limit = _bound(world, until) if world and until else until
        if limit is not None and at > limit:
            return "waiting"  # the world's next event comes first; the recovery goes on after it
        clock.move_to(at)
        counts = recovery_advance(cluster_ids=[cluster.pk])
        moved = any(counts.get(kind) for kind in RECOVERY_STEPS)
        if world and counts.get("ladder"):
            world[0].schedule(at)  # a ladder that reached its repair: the operator's clock starts now
    return "ended"


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
class _Precursors:
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
    lemons: _Lemons | None
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
        report = _target(strike, self.draws[n], self.job, self.lemons)
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
class _Repairs:
    """The operator: a node whose ladder waits for a repair is repaired after an exponential time of mean ``hours``
    through ``escalation_repaired``; the ladder then checks it and returns it to the spare pool."""

    cluster: object
    hours: float
    seed: int
    lemons: _Lemons | None = None
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
class _Links:
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


def _next_event(queues, until: datetime):
    """The world's queue whose event comes first, at or before ``until`` (None when none does)."""
    ready = [queue for queue in queues if queue.due and queue.due[0][0] <= until]
    return min(ready, key=lambda queue: queue.due[0][0], default=None)


def _bound(queues, until: datetime) -> datetime:
    """``until``, or the world's first event before it: how far beat's steps may go before the world acts."""
    first = _next_event(queues, until)
    return first.due[0][0] if first else until


def _until(clock, cluster, until: datetime, world: tuple) -> None:
    """Beat's steps and the world's events (``world``: the repairs first, then links coming back and failing back,
    precursors showing), in time order, up to ``until``: the clock only moves forward, and never past an event
    before the step after it."""
    from django.utils import timezone

    while True:
        _recover(clock, cluster, until=until, world=world)
        world[0].schedule(timezone.now())
        first = _next_event(world, until)
        if first is None:
            return
        first.run_next(clock)


def _recorded(job, config: WhatIfConfig, end: datetime) -> dict:
    """What the product recorded for the job: its phases' hours, the ledger's GPU-hours and work redone, and the
    effective training time they come to (with the formula's checkpoint-write stalls, which the simulated job does
    not have): a job that failed stops running, and its hours after that count as lost."""
    from django.db.models import Count, F, Sum

    from jobs.models import JobPhase, RecoveryAction

    hours = {"running": 0.0, "recovering": 0.0, "degraded": 0.0}
    for kind, began, ended in JobPhase.objects.filter(job=job).values_list("kind", "started_at", "ended_at"):
        began, ended = max(began, START), min(ended or end, end)
        if ended > began:
            hours[kind] = hours.get(kind, 0.0) + (ended - began).total_seconds() / 3600
    mine = RecoveryAction.objects.filter(job=job)
    by_kind = {
        kind: {"succeeded": n, "work_redone_hours": round((work or 0.0) / 3600, 3)}
        for kind, n, work in mine.filter(state="succeeded")
        .values("kind")
        .annotate(n=Count("pk"), work=Sum("work_lost_seconds"))
        .values_list("kind", "n", "work")
        .order_by("kind")
    }
    sums = mine.aggregate(
        lost=Sum("gpu_hours_lost"),
        baseline=Sum("gpu_hours_baseline"),
        work=Sum("work_lost_seconds"),
        slowed=Sum(F("degraded_seconds") * F("slowdown")),  # full-speed seconds lost to running degraded
    )
    wall = config.days * 24
    work = (sums["work"] or 0.0) / 3600
    checkpoint_writes = hours["running"] * 3600 / (config.checkpoint_minutes * 60)
    stalls = checkpoint_writes * config.checkpoint_write_seconds / 3600
    lost = sums["lost"] or 0.0
    slowed = (sums["slowed"] or 0.0) / 3600
    return {
        "recovering_hours": round(hours["recovering"], 2),
        "degraded_hours": round(hours["degraded"], 2),
        "work_redone_hours": round(work, 2),
        "checkpoint_write_hours": round(stalls, 2),
        "gpu_hours_lost": round(lost, 1),
        "gpu_hours_baseline": round(sums["baseline"] or 0.0, 1),
        "gpu_hours_saved": round((sums["baseline"] or 0.0) - lost, 1),
        "running_hours": round(hours["running"], 2),
        "slowed_hours": round(slowed, 3),  # full-speed hours lost to running degraded
        # the job's hours at full speed: running, less the work redone, the checkpoint stalls and the slowdown
        "effective_training_time": round(max(0.0, hours["running"] - work - stalls - slowed) / wall, 4),
        # the succeeded recoveries of each kind and the work each kind redid (what re-costing a price needs)
        "by_kind": by_kind,
    }


def decisions_of(job) -> list[dict]:
    """Each fault of the job's cluster in order: its kind and the recovery actions recorded for it (kind, state),
    and the ledger's GPU-hours: what the live path and the replay are compared on."""
    from django.db.models import Prefetch

    from jobs.models import FaultEvent, RecoveryAction

    faults = FaultEvent.objects.filter(cluster_id=job.cluster_id).order_by("received_at", "pk")
    out = []
    for fault in faults.prefetch_related(Prefetch("actions", RecoveryAction.objects.order_by("pk"))):
        actions = list(fault.actions.all())
        out.append(
            {
                "kind": fault.kind,
                "actions": [[a.kind, a.state] for a in actions],
                "gpu_hours_lost": round(sum(a.gpu_hours_lost or 0.0 for a in actions), 3),
            }
        )
    return out


@dataclass
class _Tally:
    """What the strikes' loop counted: how each strike's recovery stood when the world's next event or the next
    strike came, intake and decision times, strikes that found the job on no node, correlated strikes by scope."""

    outcomes: Counter = field(default_factory=Counter)
    decide_ms: list = field(default_factory=list)
    missing: int = 0
    correlated: Counter = field(default_factory=Counter)


def _strike_all(
    clock, cluster, job, config: WhatIfConfig, strikes, draws, world: tuple, end: datetime
) -> _Tally:
    """Each strike in turn: the world's events and beat's steps up to it, its reports through the product's intake
    (the decision in-process), then its recovery until the world's next event or the next strike."""
    from django.utils import timezone

    from jobs.services.faults import FaultReport, fault_ingest_many

    repairs, links, precursors = world
    tally = _Tally()
    times = [START + timedelta(hours=strike.at_hours) for strike in strikes]
    for n, (strike, draw, at) in enumerate(zip(strikes, draws, times, strict=True)):
        _until(clock, cluster, at, world)
        clock.move_to(max(at, timezone.now()))
        # a strike a precursor warned of hits the node it warned of, whether the job is still there or not
        reports, scope = _reports_of(strike, draw, job, config, precursors.lemons, precursors.targets.get(n))
        if not reports:  # the job holds no nodes now (it failed, or waits for them)
            tally.missing += 1
            continue
        t0 = time.perf_counter()
        fault_ingest_many(source="simulator", reports=[FaultReport(**report) for report in reports])
        tally.decide_ms.append(1000 * (time.perf_counter() - t0))
        precursors.struck(n)
        tally.correlated[scope] += 1
        for report in reports:
            links.schedule(at, report)
        following = min(times[n + 1] if n + 1 < len(times) else end, end)
        tally.outcomes[_recover(clock, cluster, len(reports), until=following, world=world)] += 1
        repairs.schedule(timezone.now())
    return tally


def replay_real_path(
    config: WhatIfConfig, *, strikes: list | None = None, connection: dict | None = None
) -> dict:
    """Replay ``config``'s interruptions (or ``strikes``, hours from the start) through the product on a virtual
    clock; ``connection`` overrides the simulated driver's settings. Returns the run's report."""
    import time_machine
    from django.utils import timezone

    from jobs.models import RecoveryAction
    from jobs.services.savings import savings_settle
    from telemetry.services.prediction import predictions_resolve

    _require_scratch()
    began = time.perf_counter()
    end = START + timedelta(days=config.days)
    with time_machine.travel(START, tick=False) as clock:
        _fresh_store()
        cluster, job = _world(config, connection)
        built = time.perf_counter()
        if strikes is None:  # the formula replay's own trace (its software-crash share included)
            strikes, draws = trace(config)
        else:
            draws = strike_draws(config.seed, len(strikes))
        lemons = _Lemons.of(cluster, config)
        repairs, links = _Repairs(cluster, config.repair_hours, config.seed, lemons), _Links(cluster)
        precursors = _Precursors(cluster, job, strikes, draws, lemons)
        world = (repairs, links, precursors)
        tally = _strike_all(clock, cluster, job, config, strikes, draws, world, end)
        _until(clock, cluster, end, world)
        clock.move_to(max(end, timezone.now()))
        # the predictions still open are judged at the end, and the savings they carry settled
        predictions_resolve(now=timezone.now())
        savings_settle(now=timezone.now())
        job.refresh_from_db()
        still_open = RecoveryAction.objects.filter(cluster=cluster, state__in=("planned", "running")).count()
        decisions = decisions_of(job)
        actions = Counter(kind for decision in decisions for kind, _ in decision["actions"])
        report = {
            "config": asdict(config),
            "interruptions": len(strikes),
            "replayed": len(tally.decide_ms),
            "struck_while_job_held_no_nodes": tally.missing,
            # how each recovery stood once its strike was handled ("waiting": for a repaired spare), and how many
            # were still planned or running when the run ended
            "recoveries": dict(tally.outcomes),
            "recoveries_open_at_end": still_open,
            # strikes that took a whole rack or one rail of a whole leaf (the formula replay's draws)
            "correlated": {scope: n for scope, n in sorted(tally.correlated.items()) if scope != "node"},
            "actions": dict(sorted(actions.items())),
            "nodes_repaired": repairs.done,
            "links_failed_back": links.failed_back,
            **lemons.report(),
            **precursors.report(),
            "job_state": job.state,
            **_recorded(job, config, end),
            "decisions": decisions,
        }
    done = time.perf_counter()
    decide_ms = tally.decide_ms
    report["timing"] = {
        "world_seconds": round(built - began, 2),
        "replay_seconds": round(done - built, 2),
        "ms_per_interruption": round(1000 * (done - built) / max(1, len(decide_ms)), 1),
        "intake_and_decision_ms_median": round(statistics.median(decide_ms), 1) if decide_ms else 0.0,
    }
    report["not_modelled"] = [
        "the streaming detectors' anomaly term (precursors reach the risk sweep as features only)",
        "checkpoint-write stalls (booked with the formula's assumption)",
    ]
    return report


def run_in_scratch(
    config: WhatIfConfig,
    *,
    strikes: list | None = None,
    connection: dict | None = None,
    timeout: float = 600.0,
) -> dict:
    """``replay_real_path`` in a process of its own on the scratch settings; returns its report."""
    return run_in_scratch_many([config], strikes=strikes, connection=connection, timeout=timeout)[0]


def run_in_scratch_many(
    configs: list[WhatIfConfig],
    *,
    strikes: list | None = None,
    connection: dict | None = None,
    timeout: float = 600.0,
) -> list[dict]:
    """``replay_real_path`` for each of ``configs`` in turn, in one process of its own on the scratch settings,
    each on a fresh store (``_fresh_store``); returns their reports in order."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="simulator.replay_settings", PYTHONUNBUFFERED="1")
    command = [sys.executable, str(ROOT / "manage.py"), "simulate", "real-path"]
    command += ["--config", json.dumps([asdict(config) for config in configs])]
    if strikes is not None:
        command += ["--strikes", json.dumps([asdict(strike) for strike in strikes])]
    if connection:
        command += ["--connection", json.dumps(connection)]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the real-path replay failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)
