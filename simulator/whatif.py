"""What-if: replay a long training run as a discrete-event simulation, once without protection and once with.

Interruptions are drawn from the fault model (simulator.profiles / sampling) for a seed. For every one,
the replay calls Lockstep's own code — triage (``jobs.triage.classify_fault``), the cost-ranked planner
(``jobs.planner.plan``), the spare ranking of placement (``jobs.placement.spare_order_key``) and the
GPU-hours ledger (``jobs.ledger``) — there is no separate model of the recovery logic and no per-node
telemetry. On top of the planner's choice the replay books what the fault model says happens: a migration off a
dead node restores its workers from the last snapshot (work lost), a share of recoveries fails and falls back,
a rack's failure takes several nodes at once, lemon nodes fail again and again, and failed nodes come back
after a repair time or, for lemons, not at all. Every assumption is listed in the report with its source
(simulator.whatif_assumptions), with a sensitivity table and Young/Daly checkpoint advice. Deterministic for a
seed.
"""

import math
import random
from collections import Counter
from dataclasses import asdict, dataclass, field, replace

from jobs.ledger import actual_gpu_hours
from jobs.placement import spare_order_key
from jobs.planner import SPARE_KINDS, Estimates, JobFacts, Situation, plan
from jobs.triage import classify_fault
from simulator import checkpointing
from simulator.profiles import (
    LEAF_COMPONENTS,
    PROFILES,
    RACK_COMPONENTS,
    SOFTWARE_COMPONENTS,
    manifestation,
    root_cause_mix,
    root_cause_weights,
)
from simulator.sampling import FaultSampler, Strike
from simulator.whatif_assumptions import SENSITIVITY, assumptions, value_of

ALL_OPERATIONS = frozenset(
    {
        "nic_failover",
        "intra_node_migration",
        "live_migration",
        "proactive_migration",
        "gpu_reset",
        "restore_from_snapshot",
        "restart_from_checkpoint",
    }
)
PUBLISHED = {
    "llama3_effective_training_time": ">90 % (Llama 3 405B, 54 days, 16,384 H100, checkpoint restart; arXiv:2407.21783)",
    "llama3_unexpected_interruptions": "419 in 54 days",
    "clockwork_recovery": "TorchPass recoveries under two minutes (Clockwork)",
}
# Recoveries that swap the dead nodes for spares (or wait for them): a migration, or a whole-job restart.
REPLACING_KINDS = frozenset(
    {"live_migration", "proactive_migration", "restart_from_checkpoint", "restore_from_snapshot"}
)


@dataclass(frozen=True)
class WhatIfConfig:
    seed: int = 1
    gpus: int = 16_384
    days: float = 54.0
    profile: str = "llama3"
    checkpoint_minutes: float = 30.0
    restart_overhead_minutes: float = 10.0  # the cluster setting's default (docs/gpu-hours.md)
    spare_fraction: float = 0.02
    repair_hours: float = 24.0  # mean of an exponential
    nodes_per_leaf: int = 16
    migration_pause_seconds: float = 30.0
    migration_work_lost_minutes: float = (
        5.0  # off a dead node: one snapshot interval of the protection runtime
    )
    checkpoint_write_seconds: float = 30.0
    software_crash_share: float | None = None  # None: Table 5's 69/419
    failed_recovery_share: float = 0.05
    rack_failure_share: float = 0.05
    leaf_failure_share: float = 0.20
    lemon_node_share: float = 0.012
    lemon_fault_share: float = 0.71
    lemon_retire_after: int = 3


@dataclass
class _Node:
    name: str
    leaf_switch: str
    rack: str
    lemon: bool = False
    risk_score: float = 0.0  # its past failures: placement hands out nodes that never failed first
    available_at: float = 0.0
    failures: int = 0


@dataclass
class RunResult:
    protected: bool
    interruptions: int = 0
    actions: Counter = field(default_factory=Counter)
    root_causes: Counter = field(default_factory=Counter)
    downtime_hours: float = 0.0  # paused, restarting, or waiting for a spare
    work_lost_hours: float = 0.0  # progress redone after restoring an older state
    degraded_hours: float = 0.0  # slowdown while degraded, in full-speed hours lost
    checkpoint_write_hours: float = 0.0  # stalled writing checkpoints
    spare_wait_hours: float = 0.0
    gpu_hours_lost: float = 0.0
    gpu_hours_baseline: float = 0.0
    no_progress_lost: int = 0
    spares_exhausted: int = 0
    failed_recoveries: int = 0
    correlated: Counter = field(default_factory=Counter)
    lemon_faults: int = 0
    hardware_faults: int = 0
    lemons_retired: int = 0
    struck_while_down: int = 0

    def report(self, wall_hours: float, gpus: int) -> dict:
        unproductive = (
            self.downtime_hours + self.work_lost_hours + self.degraded_hours + self.checkpoint_write_hours
        )
        return {
            "protected": self.protected,
            "interruptions": self.interruptions,
            "effective_training_time": round(1 - unproductive / wall_hours, 4),
            "unplanned_downtime_hours": round(self.downtime_hours, 2),
            "work_redone_hours": round(self.work_lost_hours, 2),
            "degraded_hours": round(self.degraded_hours, 2),
            "checkpoint_write_hours": round(self.checkpoint_write_hours, 2),
            "spare_wait_hours": round(self.spare_wait_hours, 2),
            "gpu_hours_lost": round(self.gpu_hours_lost, 1),
            "gpu_hours_baseline": round(self.gpu_hours_baseline, 1),
            "gpu_hours_saved": round(self.gpu_hours_baseline - self.gpu_hours_lost, 1),
            "share_no_progress_lost": round(self.no_progress_lost / self.interruptions, 4)
            if self.interruptions
            else 0.0,
            "actions": dict(sorted(self.actions.items())),
            "restarts_from_checkpoint": self.actions["restart_from_checkpoint"],
            "faults_by_root_cause": dict(self.root_causes.most_common()),
            "spares_exhausted": self.spares_exhausted,
            "failed_recoveries": self.failed_recoveries,
            "correlated_failures": dict(sorted(self.correlated.items())),
            "hardware_faults_on_lemon_nodes": round(self.lemon_faults / self.hardware_faults, 4)
            if self.hardware_faults
            else 0.0,
            "lemons_retired": self.lemons_retired,
            "struck_while_down": self.struck_while_down,
            "gpus": gpus,
        }


def _affected(strike: Strike) -> int:
    return {"node_unreachable": 8, "software_crash": 0}.get(strike.kind, 1)


@dataclass(frozen=True)
class _Draws:
    """The per-strike random numbers the replay uses beyond the sampler's, fixed for a seed and shared by every
    run and sensitivity row (common random numbers)."""

    scope: float
    fail: float
    repair: float
    lemon: float
    slot: float


def strike_draws(seed: int, count: int) -> list[_Draws]:
    rng = random.Random(f"whatif-{seed}")
    return [_Draws(*(rng.random() for _ in range(5))) for _ in range(count)]


@dataclass
class _Run:
    """One replay as it goes: the job's nodes by position, the spares (joined by nodes back from repair),
    which positions hold a lemon, and the job's clock in seconds."""

    slots: list[_Node]
    pool: list[_Node]
    lemon_slots: set[int]
    resume_at: float = 0.0  # when the job runs again after the last interruption
    last_checkpoint: float = 0.0  # wall time from which the job's progress since its last checkpoint runs
    checkpoints: int = 0


def _job_nodes(config: WhatIfConfig) -> _Run:
    """The job's nodes and the spares, each a lemon by a draw fixed for the seed."""
    nodes = config.gpus // 8
    lemon_keys = random.Random(f"lemons-{config.seed}")

    def node(index: int) -> _Node:
        return _Node(
            f"node-{index}",
            f"leaf-{index // config.nodes_per_leaf}",
            f"rack-{index // 8}",
            lemon=lemon_keys.random() < config.lemon_node_share,
        )

    slots = [node(i) for i in range(nodes)]
    pool = [node(nodes + i) for i in range(max(1, int(nodes * config.spare_fraction)))]
    return _Run(slots, pool, {i for i, n in enumerate(slots) if n.lemon})


def _replay(
    config: WhatIfConfig, strikes: list[Strike], draws: list[_Draws], *, protected: bool, progress=None
) -> RunResult:
    run = _job_nodes(config)
    checkpoint = config.checkpoint_minutes * 60
    wall = config.days * 86400
    result = RunResult(protected=protected)
    estimates = Estimates(migration_pause=config.migration_pause_seconds)
    for index, strike in enumerate(strikes):
        if progress and index % 50 == 0:
            progress(index / max(1, len(strikes)))
        at = strike.at_hours * 3600
        if at >= wall:
            break
        if at < run.resume_at:
            # the job is not running (restarting, or waiting for spares): nothing of it to interrupt
            result.struck_while_down += 1
            continue
        if at > run.last_checkpoint:  # a checkpoint every `checkpoint` seconds of progress
            written = (at - run.last_checkpoint) // checkpoint
            run.checkpoints += int(written)
            run.last_checkpoint += written * checkpoint
        _interruption(config, run, strike, draws[index], at, estimates, result)
    if run.resume_at < wall and wall > run.last_checkpoint:
        run.checkpoints += int((wall - run.last_checkpoint) // checkpoint)
    result.checkpoint_write_hours = run.checkpoints * config.checkpoint_write_seconds / 3600
    if progress:
        progress(1.0)
    return result


def _interruption(config, run: _Run, strike: Strike, draw: _Draws, at: float, estimates, result) -> None:
    """One strike on the running job: the planner's choice for it (and the fallback when that fails), booked
    into ``result``, and the job's clock moved past it."""
    protected = result.protected
    verdict = classify_fault(strike.kind, xid=strike.xid)
    result.interruptions += 1
    result.root_causes[strike.component] += 1
    slot, hit, impact = _struck(config, run, strike, verdict, draw, result)
    dead = hit if impact in ("device", "node") or len(hit) > 1 else []
    near = run.slots[slot]
    free = sorted((s for s in run.pool if s.available_at <= at), key=lambda s: spare_order_key(s, near))
    facts = JobFacts(
        gpus=config.gpus,
        gpus_affected=8 * len(hit) if len(hit) > 1 else _affected(strike),
        seconds_since_checkpoint=at - run.last_checkpoint,
        protected=protected,
        restart_overhead_seconds=config.restart_overhead_minutes * 60,
    )
    situation = Situation(
        impact=impact,
        healthy_nic=strike.kind in ("nic_down", "link_flap"),
        spare_node=len(free) >= max(1, len(dead)),
        gpu_reset=verdict.remediation == "gpu_reset",
        supports=ALL_OPERATIONS,
    )
    decision = plan(facts, situation, estimates)
    chosen = decision.chosen
    if chosen is None:
        return
    spent = 0.0  # seconds lost to a recovery attempt that failed
    if protected and chosen.kind != "restart_from_checkpoint" and draw.fail < config.failed_recovery_share:
        result.failed_recoveries += 1
        spent = chosen.pause_seconds  # downtime; the job made no progress during the attempt
        decision = plan(facts, replace(situation, excluded=frozenset({chosen.kind})), estimates)
        chosen = decision.chosen
    work = chosen.work_lost_seconds
    if chosen.kind in SPARE_KINDS and manifestation(strike.component).state_lost:
        # the dead node's workers come back from the last snapshot, or the checkpoint if that is newer
        work = min(config.migration_work_lost_minutes * 60, facts.seconds_since_checkpoint)
    wait = 0.0
    if dead and chosen.kind in REPLACING_KINDS:
        wait = _replace_nodes(config, run.slots, run.pool, run.lemon_slots, dead, near, at, draw, result)
    _book(config, run, decision, at, spent=spent, work=work, wait=wait, result=result)


def _struck(config, run: _Run, strike: Strike, verdict, draw: _Draws, result) -> tuple[int, list[int], str]:
    """Where a strike lands: the position it hits (a lemon's more often, for hardware), the positions it takes
    down (a whole rack's at times) and the job impact the planner sees."""
    slot = strike.gpu // 8
    if strike.component not in SOFTWARE_COMPONENTS:
        result.hardware_faults += 1
        if run.lemon_slots and draw.lemon < config.lemon_fault_share:
            ordered = sorted(run.lemon_slots)
            slot = ordered[min(len(ordered) - 1, int(draw.slot * len(ordered)))]
        result.lemon_faults += run.slots[slot].lemon
    impact, hit = verdict.job_impact, [slot]
    if strike.component in RACK_COMPONENTS and draw.scope < config.rack_failure_share:
        first = slot - slot % 8
        # several nodes at once: a whole-job restart for the planner
        hit, impact = list(range(first, min(config.gpus // 8, first + 8))), "restart"
        result.correlated["rack"] += 1
    elif strike.component in LEAF_COMPONENTS and draw.scope < config.leaf_failure_share:
        # one rail NIC on each node under the leaf: still a NIC fault on each, the nodes live on
        result.correlated["leaf"] += 1
    return slot, hit, impact


def _book(config, run: _Run, decision, at: float, *, spent: float, work: float, wait: float, result) -> None:
    """Book a recovery's cost (what falls past the end of the run is not lost within it); resume the job."""
    chosen = decision.chosen
    wall = config.days * 86400
    since_checkpoint = at - run.last_checkpoint
    pause = min(spent + chosen.pause_seconds + wait, wall - at)
    wait = min(wait, pause)
    work = min(work, wall - at - pause)
    result.actions[chosen.kind] += 1
    result.gpu_hours_lost += actual_gpu_hours(
        gpus=config.gpus,
        pause_seconds=pause,
        work_lost_seconds=work,
        degraded_seconds=chosen.degraded_seconds,
        slowdown=chosen.slowdown,
    )
    result.gpu_hours_baseline += decision.baseline
    result.downtime_hours += pause / 3600
    result.spare_wait_hours += wait / 3600
    result.work_lost_hours += work / 3600
    result.degraded_hours += chosen.degraded_seconds * chosen.slowdown / 3600
    if work == 0:
        result.no_progress_lost += 1
    run.resume_at = at + pause
    # the job resumes with the progress it kept since its last checkpoint
    run.last_checkpoint = run.resume_at - (since_checkpoint - work)


def _replace_nodes(config, slots, pool, lemon_slots, dead, near, at, draw, result) -> float:
    """Swap the dead nodes for the best free spares, waiting for repaired ones where too few are free; the dead
    nodes go to repair and come back as spares (a lemon that failed too often is replaced by a sound node).
    Returns the wait."""
    repair = -math.log(1.0 - draw.repair) * config.repair_hours * 3600
    free = sorted((s for s in pool if s.available_at <= at), key=lambda s: spare_order_key(s, near))
    wait = 0.0
    if len(free) < len(dead):
        result.spares_exhausted += 1
        coming = sorted(s.available_at for s in pool if s.available_at > at)
        missing = len(dead) - len(free)
        # too few spares, even counting those in repair: the dead nodes are repaired in place
        wait = (coming[missing - 1] if len(coming) >= missing else at + repair) - at
        free = sorted(
            (s for s in pool if s.available_at <= at + wait), key=lambda s: spare_order_key(s, near)
        )
    for position, slot in enumerate(dead):
        broken = slots[slot]
        broken.failures += 1
        broken.risk_score = float(broken.failures)
        broken.available_at = at + wait + repair
        if position < len(free):
            spare = free[position]
            pool.remove(spare)
            slots[slot] = spare
            if spare.lemon:
                lemon_slots.add(slot)
            else:
                lemon_slots.discard(slot)
            if broken.lemon and broken.failures >= config.lemon_retire_after:
                # found out: the lemon goes back to its vendor and a sound replacement arrives after the repair time
                result.lemons_retired += 1
                broken.lemon, broken.failures, broken.risk_score = False, 0, 0.0
            pool.append(broken)
    return wait


def protected_restart_share(config: WhatIfConfig) -> float:
    """The share of interruptions that still restart from the checkpoint with Lockstep, by the fault model's
    arithmetic (software crashes, whole-rack failures, failed recoveries): the closed form beside the replay."""
    components, _ = root_cause_mix()
    weights = root_cause_weights(config.software_crash_share)
    total = sum(weights)
    share = 0.0
    for component, weight in zip(components, weights, strict=True):
        seen = manifestation(component)
        if component in SOFTWARE_COMPONENTS:
            share += weight
        elif seen.kind == "thermal":
            continue
        elif component in RACK_COMPONENTS:
            share += weight * (
                config.rack_failure_share + (1 - config.rack_failure_share) * config.failed_recovery_share
            )
        else:
            share += weight * config.failed_recovery_share
    return share / total


def trace(config: WhatIfConfig) -> tuple[list[Strike], list[_Draws]]:
    """The config's sampled interruptions and their per-strike draws: the same for every replay of a seed."""
    sampler = FaultSampler(PROFILES[config.profile], config.gpus, config.seed)
    if config.software_crash_share is not None:
        sampler.weights = root_cause_weights(config.software_crash_share)  # one draw per strike either way
    strikes = sampler.until(config.days * 24)
    return strikes, strike_draws(config.seed, len(strikes))


def _both(config: WhatIfConfig, progress=None) -> tuple[dict, dict]:
    strikes, draws = trace(config)
    hours = config.days * 24

    def half(offset):
        return (lambda share: progress(offset + share / 2)) if progress else None

    without = _replay(config, strikes, draws, protected=False, progress=half(0.0)).report(hours, config.gpus)
    with_ = _replay(config, strikes, draws, protected=True, progress=half(0.5)).report(hours, config.gpus)
    return without, with_


def _sensitivity(config: WhatIfConfig, step) -> list[dict]:
    rows = []
    for row in SENSITIVITY:
        cases = {}
        for case in ("pessimistic", "optimistic"):
            value = getattr(row, case)
            without, with_ = _both(replace(config, **{row.field: value}))
            cases[case] = {
                "value": value,
                "unprotected": without["effective_training_time"],
                "protected": with_["effective_training_time"],
            }
            step()
        rows.append(
            {
                "assumption": row.label,
                "field": row.field,
                "unit": row.unit,
                "value": value_of(config, row.field),
                "why": row.why,
                **cases,
            }
        )
    return rows


def _checkpoint_advice(config: WhatIfConfig, without: dict, with_: dict, hours: float) -> dict:
    """Young/Daly from the replay's own restart rate, then each run replayed again at its Daly interval."""
    advice = {
        "checkpoint_write_seconds": config.checkpoint_write_seconds,
        "source": "Young (1974), Daly (2006)",
    }
    for key, run, protected in (("unprotected", without, False), ("protected", with_, True)):
        restarts = max(1, run["restarts_from_checkpoint"])
        found = checkpointing.advice(
            mtbf_hours=hours / restarts,
            write_seconds=config.checkpoint_write_seconds,
            restart_seconds=config.restart_overhead_minutes * 60,
            current_interval_seconds=config.checkpoint_minutes * 60,
        )
        at_daly = replace(config, checkpoint_minutes=max(1.0, found["daly_minutes"]))
        found["effective_training_time_replayed_at_daly"] = _both(at_daly)[1 if protected else 0][
            "effective_training_time"
        ]
        advice[key] = found
    return advice


def whatif_run(config: WhatIfConfig, progress=None, *, sensitivity: bool = True) -> dict:
    """Replay ``config`` without and with protection; with ``sensitivity``, also each sensitivity row and the
    checkpoint advice. Returns the report (JSON-safe). ``progress(share)`` is called as it goes, 0 to 1."""
    profile = PROFILES[config.profile]
    hours = config.days * 24
    steps = 2 + (2 * len(SENSITIVITY) + 1 if sensitivity else 0)
    done = [0]

    def step():
        done[0] += 1
        if progress:
            progress(done[0] / steps)

    without, with_ = _both(config, progress=(lambda share: progress(2 * share / steps)) if progress else None)
    done[0] = 2
    report = {
        "config": asdict(config),
        "profile": {
            "name": profile.name,
            "source": profile.source,
            "mean_hours_between_interruptions": round(profile.mean_hours_between(config.gpus), 2),
        },
        "wall_hours": hours,
        "unprotected": without,
        "protected": with_,
        "published": PUBLISHED,
        # the share of restart-from-checkpoint's unplanned downtime (pauses, restarts, waits) that Lockstep avoids
        "unplanned_downtime_reduction": round(
            1 - with_["unplanned_downtime_hours"] / without["unplanned_downtime_hours"], 4
        )
        if without["unplanned_downtime_hours"]
        else 0.0,
        "assumptions": assumptions(config),
    }
    if sensitivity:
        report["sensitivity"] = _sensitivity(config, step)
        report["checkpoint_advice"] = _checkpoint_advice(config, without, with_, hours)
        step()
    if progress:
        progress(1.0)
    return report
