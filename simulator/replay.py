"""The what-if's interruptions through the product's own services, on a virtual clock, in a scratch store.

``manage.py simulate what-if`` (and a what-if run on the analytics worker) adds this run to the what-if's report
(issue 20). The formula replay (``simulator.whatif``) calls the planner's pure functions; this one feeds the same
sampled interruptions (the same ``FaultSampler``, profile and seed) to the running product's code: fault intake and
its incident, the decision (placement, budgets, the escalation ladder, a restart waiting for a spare), the simulated
driver's operations with their durations, beat's recovery step, failback, the risk sweep and its predictions, the
ledger. It builds one protected cluster (the job's nodes and ``spare_fraction`` spares, 16 nodes a leaf) and one
job on all of it, then for each strike in turn moves the clock to it (``time-machine``: every ``timezone.now()`` of
the product reads it), reports it through ``fault_ingest_many`` (the decision runs in-process) and moves the clock
to each due step, running ``recovery_advance``. It uses the formula replay's own per-strike draws, so the same
strikes are correlated in both (racks, leaves, lemons), and the simulated driver fails ``failed_recovery_share`` of
the recovery operations partway (``recovery_failure_probability``, seeded); the product falls back as it would live.

The world's part (``simulator.replay_world``: the operator's repairs, links coming back, precursors showing before
their strikes) is played in time order with beat's steps: the clock only moves forward, and beat's steps stop
before the world's next event.

It runs only in a process on the scratch settings (``simulator.replay_settings``: an in-memory SQLite database,
an in-process channel layer and cache, Celery eager, no outbox relay, no Redis), which ``run_in_scratch`` starts;
``replay_real_path`` refuses anything else, so it cannot write to the live fleet. Not modelled: the streaming
detectors' anomaly term, checkpoint-write stalls (booked here with the formula's assumption) and the unprotected
run (still the formula's). ``simulator.replay_sensitivity`` builds the sensitivity table on this run.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from simulator.replay_world import START, Lemons, Links, Precursors, Repairs, reports_of
from simulator.whatif import WhatIfConfig, strike_draws, trace

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
        reports, scope = reports_of(strike, draw, job, config, precursors.lemons, precursors.targets.get(n))
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
        lemons = Lemons.of(cluster, config)
        repairs, links = Repairs(cluster, config.repair_hours, config.seed, lemons), Links(cluster)
        precursors = Precursors(cluster, job, strikes, draws, lemons)
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
