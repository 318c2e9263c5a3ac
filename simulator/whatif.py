"""What-if: replay a long training run as a discrete-event simulation, once without protection and once with.

Interruptions are drawn from the fault model (simulator.profiles / sampling) for a seed. For every one,
the replay calls Lockstep's own code — triage (``jobs.triage.classify_fault``), the cost-ranked planner
(``jobs.planner.plan``), the spare ranking of placement (``jobs.placement.spare_order_key``) and the
GPU-hours ledger (``jobs.ledger``) — there is no separate model of the recovery logic and no per-node
telemetry. Deterministic for a seed. The report sets the result beside the published figures (Llama 3:
effective training time above 90 % with checkpoint restart).
"""

from collections import Counter
from dataclasses import asdict, dataclass, field

from jobs.placement import spare_order_key
from jobs.planner import Estimates, JobFacts, Situation, plan
from jobs.triage import classify_fault
from simulator.profiles import PROFILES
from simulator.sampling import FaultSampler, Strike

ALL_OPERATIONS = frozenset({"nic_failover", "intra_node_migration", "live_migration", "proactive_migration", "gpu_reset",
                            "restore_from_snapshot", "restart_from_checkpoint"})
PUBLISHED = {
    "llama3_effective_training_time": ">90 % (Llama 3 405B, 54 days, 16,384 H100, checkpoint restart; arXiv:2407.21783)",
    "llama3_unexpected_interruptions": "419 in 54 days",
    "clockwork_recovery": "TorchPass recoveries under two minutes (Clockwork)",
}


@dataclass(frozen=True)
class WhatIfConfig:
    seed: int = 1
    gpus: int = 16_384
    days: float = 54.0
    profile: str = "llama3"
    checkpoint_minutes: float = 30.0
    restart_overhead_minutes: float = 10.0   # the cluster setting's default (docs/gpu-hours.md)
    spare_fraction: float = 0.02
    repair_hours: float = 24.0
    nodes_per_leaf: int = 16


@dataclass
class _Spare:
    name: str
    leaf_switch: str
    rack: str
    risk_score: float
    available_at: float = 0.0


@dataclass
class RunResult:
    protected: bool
    interruptions: int = 0
    actions: Counter = field(default_factory=Counter)
    root_causes: Counter = field(default_factory=Counter)
    downtime_hours: float = 0.0          # paused or restarting
    work_lost_hours: float = 0.0         # progress redone after restoring an older state
    degraded_hours: float = 0.0          # slowdown while degraded, in full-speed hours lost
    gpu_hours_lost: float = 0.0
    gpu_hours_baseline: float = 0.0
    no_progress_lost: int = 0
    spares_exhausted: int = 0

    def report(self, wall_hours: float, gpus: int) -> dict:
        unproductive = self.downtime_hours + self.work_lost_hours + self.degraded_hours
        return {
            "protected": self.protected,
            "interruptions": self.interruptions,
            "effective_training_time": round(1 - unproductive / wall_hours, 4),
            "unplanned_downtime_hours": round(self.downtime_hours, 2),
            "work_redone_hours": round(self.work_lost_hours, 2),
            "gpu_hours_lost": round(self.gpu_hours_lost, 1),
            "gpu_hours_baseline": round(self.gpu_hours_baseline, 1),
            "gpu_hours_saved": round(self.gpu_hours_baseline - self.gpu_hours_lost, 1),
            "share_no_progress_lost": round(self.no_progress_lost / self.interruptions, 4) if self.interruptions else 0.0,
            "actions": dict(sorted(self.actions.items())),
            "faults_by_root_cause": dict(self.root_causes.most_common()),
            "spares_exhausted": self.spares_exhausted,
            "gpus": gpus,
        }


def _affected(strike: Strike) -> int:
    return {"node_unreachable": 8, "software_crash": 0}.get(strike.kind, 1)


def _replay(config: WhatIfConfig, strikes: list[Strike], *, protected: bool, progress=None) -> RunResult:
    nodes = config.gpus // 8
    spares = [_Spare(f"spare-{i}", f"leaf-{(nodes + i) // config.nodes_per_leaf}", f"rack-{(nodes + i) // 8}", 0.0)
              for i in range(max(1, int(nodes * config.spare_fraction)))]
    restart_overhead = config.restart_overhead_minutes * 60
    checkpoint = config.checkpoint_minutes * 60
    result = RunResult(protected=protected)
    estimates = Estimates()
    resume_at = 0.0          # seconds: when the job runs again after the last interruption
    last_checkpoint = 0.0    # seconds: wall time of the last checkpoint
    for index, strike in enumerate(strikes):
        if progress and index % 50 == 0:
            progress(index / max(1, len(strikes)))
        at = max(strike.at_hours * 3600, resume_at)
        # checkpoints happen every `checkpoint` seconds of running since the job last (re)started
        if at > last_checkpoint:
            last_checkpoint += ((at - last_checkpoint) // checkpoint) * checkpoint
        verdict = classify_fault(strike.kind, xid=strike.xid)
        result.interruptions += 1
        result.root_causes[strike.component] += 1
        node_index = strike.gpu // 8
        near = _Spare(f"node-{node_index}", f"leaf-{node_index // config.nodes_per_leaf}", f"rack-{node_index // 8}", 0.0)
        free = sorted((s for s in spares if s.available_at <= at), key=lambda s: spare_order_key(s, near))
        facts = JobFacts(gpus=config.gpus, gpus_affected=_affected(strike), seconds_since_checkpoint=at - last_checkpoint,
                         protected=protected, restart_overhead_seconds=restart_overhead)
        situation = Situation(impact=verdict.job_impact, healthy_nic=strike.kind in ("nic_down", "link_flap"),
                              spare_node=bool(free), gpu_reset=verdict.remediation == "gpu_reset",
                              supports=ALL_OPERATIONS)
        decision = plan(facts, situation, estimates)
        chosen = decision.chosen
        if chosen is None:
            continue
        if verdict.job_impact in ("device", "node", "nic") and not free and protected:
            result.spares_exhausted += 1
        if chosen.kind in ("live_migration", "proactive_migration") and free:
            spare = free[0]
            spare.available_at = at + config.repair_hours * 3600  # the failed node is repaired, then spare again
        result.actions[chosen.kind] += 1
        result.gpu_hours_lost += chosen.gpu_hours_lost
        result.gpu_hours_baseline += decision.baseline
        result.downtime_hours += chosen.pause_seconds / 3600
        result.work_lost_hours += chosen.work_lost_seconds / 3600
        result.degraded_hours += chosen.degraded_seconds * chosen.slowdown / 3600
        if chosen.work_lost_seconds == 0:
            result.no_progress_lost += 1
        resume_at = at + chosen.pause_seconds
        if chosen.work_lost_seconds > 0:
            last_checkpoint = resume_at   # back at the restore point; the schedule restarts with the job
    if progress:
        progress(1.0)
    return result


def whatif_run(config: WhatIfConfig, progress=None) -> dict:
    """Replay ``config`` without and with protection; returns the report (JSON-safe)."""
    profile = PROFILES[config.profile]
    hours = config.days * 24
    strikes = FaultSampler(profile, config.gpus, config.seed).until(hours)

    def half(offset):
        return (lambda share: progress(offset + share / 2)) if progress else None

    unprotected = _replay(config, strikes, protected=False, progress=half(0.0))
    protected = _replay(config, strikes, protected=True, progress=half(0.5))
    return {
        "config": asdict(config),
        "profile": {"name": profile.name, "source": profile.source,
                    "mean_hours_between_interruptions": round(profile.mean_hours_between(config.gpus), 2)},
        "wall_hours": hours,
        "unprotected": unprotected.report(hours, config.gpus),
        "protected": protected.report(hours, config.gpus),
        "published": PUBLISHED,
    }


def format_report(report: dict) -> str:
    """The report as a few lines for the command line."""
    c, u, p = report["config"], report["unprotected"], report["protected"]
    lines = [
        f"What-if: {c['gpus']:,} GPUs for {c['days']:g} days, profile {report['profile']['name']} "
        f"({report['profile']['source']}), seed {c['seed']}; checkpoint every {c['checkpoint_minutes']:g} min, "
        f"restart overhead {c['restart_overhead_minutes']:g} min",
        f"interruptions: {u['interruptions']} (one every {report['profile']['mean_hours_between_interruptions']} h expected)",
        f"{'':32s}{'without protection':>20s}{'with Lockstep':>16s}",
    ]
    for label, key, fmt in [("effective training time", "effective_training_time", "{:.1%}"),
                            ("unplanned downtime (h)", "unplanned_downtime_hours", "{:.1f}"),
                            ("work redone (h)", "work_redone_hours", "{:.1f}"),
                            ("GPU-hours lost", "gpu_hours_lost", "{:,.0f}"),
                            ("GPU-hours saved vs restart", "gpu_hours_saved", "{:,.0f}"),
                            ("interruptions losing no progress", "share_no_progress_lost", "{:.1%}")]:
        lines.append(f"{label:32s}{fmt.format(u[key]):>20s}{fmt.format(p[key]):>16s}")
    lines.append(f"actions without protection: {u['actions']}")
    lines.append(f"actions with Lockstep:      {p['actions']}")
    top = ", ".join(f"{k} {v}" for k, v in list(p["faults_by_root_cause"].items())[:6])
    lines.append(f"faults by root cause: {top}, …")
    lines.append(f"published: Llama 3 effective training time {report['published']['llama3_effective_training_time']}")
    return "\n".join(lines)
