"""The cost-ranked planner: plain functions, no database.

For one affected job, list every recovery (feasible or not, and why), price each in expected GPU-hours lost
with the ledger's formula (docs/gpu-hours.md), and choose the cheapest feasible one. Unprotected jobs can
only restart from checkpoint.
"""

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from jobs.ledger import actual_gpu_hours, baseline_gpu_hours


class Impact(enum.StrEnum):
    """What the faults hitting a job mean for it (triage.FaultVerdict.job_impact), most severe first."""

    NODE = "node"  # the whole node is gone
    DEVICE = "device"  # a GPU is gone
    NIC = "nic"  # one NIC is down
    RESTART = "restart"  # the job itself must restart (it crashed, or workers on several nodes are hit)
    DEGRADED = "degraded"  # it runs slower
    RISK = "risk"  # its node may fail soon
    NONE = "none"

    @property
    def stops_job(self) -> bool:
        return self in (Impact.NODE, Impact.DEVICE, Impact.NIC, Impact.RESTART)

    @property
    def rank(self) -> int:
        return list(Impact).index(self)


# The recoveries that stop the whole job and restart it elsewhere: they answer faults on any of its nodes.
WHOLE_JOB_KINDS = frozenset({"restart_from_checkpoint", "restore_from_snapshot"})


@dataclass(frozen=True)
class JobFacts:
    gpus: int
    gpus_affected: int
    seconds_since_checkpoint: float
    protected: bool
    restart_overhead_seconds: float
    seconds_since_snapshot: float | None = None  # None: no snapshot newer than the checkpoint


@dataclass(frozen=True)
class Situation:
    """What the fault did and what the cluster offers right now."""

    impact: str  # triage.FaultVerdict.job_impact
    healthy_nic: bool = False
    spare_gpus_on_node: int = 0
    spare_node: bool = False
    spare_wait_seconds: float = 0.0  # expected wait for the migration budget
    gpu_reset: bool = False  # the catalogue recommends a reset and the driver can do it
    risk: float = 0.5  # probability the node fails soon (predicted failures)
    supports: frozenset[str] = frozenset()
    excluded: frozenset[str] = frozenset()  # kinds already tried for this recovery that failed
    standbys: int = 0  # live standbys in the job's own allocation (its runtime's reports), off the lost node


@dataclass(frozen=True)
class Estimates:
    """Expected durations (seconds) and slowdowns. These are the planner's own defaults; for a cluster they are
    replaced by what its completed recoveries measured (jobs.services.estimates), and ``basis`` says, per field,
    which one a plan used."""

    nic_failover: float = 1.0
    migration_pause: float = 30.0
    intra_node_pause: float = 10.0
    gpu_reset: float = 20.0
    restore_pause: float = 30.0
    nic_degraded_seconds: float = 1800.0  # until the failed NIC is repaired and the job fails back
    link_degraded_seconds: float = 600.0  # until a grey link is clean again and the job fails back
    nic_slowdown: float = 0.01  # one rail fewer: the job runs slightly slower
    link_degraded_slowdown: float = 0.30  # a degraded link slows every collective of the job
    rank_replacement_pause: float = 5.0  # a standby takes the lost rank's place; the survivors keep running
    basis: dict = field(default_factory=dict, compare=False, hash=False)
    # Measured restart costs on the cluster by job size: estimate name → (samples, seconds) (jobs.services.estimates)
    restarts: dict = field(default_factory=dict, compare=False, hash=False)

    def basis_of(self, name: str) -> str:
        return self.basis.get(name, "default")


@dataclass(frozen=True)
class Option:
    kind: str
    feasible: bool
    gpu_hours_lost: float
    pause_seconds: float = 0.0
    work_lost_seconds: float = 0.0
    degraded_seconds: float = 0.0
    slowdown: float = 0.0
    why: str = ""

    def as_dict(self) -> dict:
        data = asdict(self)
        data["gpu_hours_lost"] = round(self.gpu_hours_lost, 4)
        return data


@dataclass(frozen=True)
class Plan:
    chosen: Option | None
    options: list[Option] = field(default_factory=list)
    baseline: float = 0.0
    stay: Option | None = None  # staying put (``stay_*``) was cheapest: nothing is done, and this is why

    @property
    def reason(self) -> str:
        best = self.chosen or self.stay
        if best is None:
            return "no recovery needed"
        others = [o for o in self.options if o is not best]
        weighed = "; ".join(
            f"{o.kind} {o.gpu_hours_lost:.2f}" + ("" if o.feasible else f" (not possible: {o.why})")
            for o in others
        )
        return (
            f"{best.kind}: {best.gpu_hours_lost:.2f} GPU-h expected lost "
            f"(restart baseline {self.baseline:.2f}); {best.why}"
            + (f". Weighed: {weighed}" if weighed else "")
        )

    def comparison(self) -> dict:
        """The decision as a record: what was chosen (or stayed), and every option with its price."""
        best = self.chosen or self.stay
        return {
            "chosen": best.kind if best else None,
            "baseline": round(self.baseline, 4),
            "options": [o.as_dict() for o in self.options],
        }


def _option(kind, feasible, why, job, *, pause, work=0.0, degraded=0.0, slowdown=0.0) -> Option:
    cost = actual_gpu_hours(
        gpus=job.gpus,
        pause_seconds=pause,
        work_lost_seconds=work,
        degraded_seconds=degraded,
        slowdown=slowdown,
    )
    return Option(kind, feasible, cost, pause, work, degraded, slowdown, why)


def options_for(job: JobFacts, situation: Situation, est: Estimates) -> list[Option]:
    """Every recovery for this job and fault, priced; infeasible ones say why."""
    impact = situation.impact
    if impact == "none":
        return []
    protected = job.protected
    unprotected = "the job is not protected"
    restart = _option(
        "restart_from_checkpoint",
        True,
        "always possible",
        job,
        pause=job.restart_overhead_seconds,
        work=job.seconds_since_checkpoint,
    )
    if impact in ("degraded", "risk") and not protected:
        return []  # the job still runs; restarting it would only lose more
    found: list[Option] = []
    snap = job.seconds_since_snapshot
    if impact in ("restart", "device", "node", "nic"):
        found.append(restart)
        ok = protected and snap is not None
        found.append(
            _option(
                "restore_from_snapshot",
                ok,
                "a snapshot newer than the checkpoint"
                if ok
                else (unprotected if not protected else "no snapshot newer than the checkpoint"),
                job,
                pause=est.restore_pause,
                work=snap or 0.0,
            )
        )
    if impact == "node":
        # A standby in the job's own allocation takes the lost rank; the survivors keep their processes and roll
        # back at most to their newest in-memory snapshot.
        ok = protected and snap is not None and situation.standbys > 0
        found.append(
            _option(
                "rank_replacement",
                ok,
                f"a live standby in the job's allocation ({situation.standbys}) takes the lost rank; the others "
                "keep running"
                if ok
                else (
                    unprotected
                    if not protected
                    else "no snapshot newer than the checkpoint"
                    if snap is None
                    else "no live standby in the job's allocation"
                ),
                job,
                pause=est.rank_replacement_pause,
                work=snap or 0.0,
            )
        )
    if impact == "device":
        ok = protected and situation.spare_gpus_on_node >= max(1, job.gpus_affected)
        found.append(
            _option(
                "intra_node_migration",
                ok,
                "a spare GPU on the same node"
                if ok
                else (unprotected if not protected else "no spare GPU on the node"),
                job,
                pause=est.intra_node_pause,
            )
        )
        ok = protected and situation.gpu_reset
        restore = snap if snap is not None else job.seconds_since_checkpoint
        found.append(
            _option(
                "gpu_reset",
                ok,
                "the catalogue recommends a reset"
                if ok
                else (unprotected if not protected else "the catalogue does not recommend a reset"),
                job,
                pause=est.gpu_reset + job.restart_overhead_seconds,
                work=restore,
            )
        )
    if impact in ("device", "node", "nic"):
        ok = protected and situation.spare_node
        why = "a spare node" + (
            f", after ~{situation.spare_wait_seconds:.0f} s for the migration budget"
            if situation.spare_wait_seconds
            else ""
        )
        found.append(
            _option(
                "live_migration",
                ok,
                why if ok else (unprotected if not protected else "no spare node"),
                job,
                pause=est.migration_pause + situation.spare_wait_seconds,
            )
        )
    if impact in ("nic", "degraded"):
        # Failing over costs its pause, then one rail fewer until the link is healthy again and the job fails back.
        ok = protected and situation.healthy_nic
        degraded = est.link_degraded_seconds if impact == "degraded" else est.nic_degraded_seconds
        found.append(
            _option(
                "nic_failover",
                ok,
                "a healthy NIC remains on the node"
                if ok
                else (unprotected if not protected else "no healthy NIC left on the node"),
                job,
                pause=est.nic_failover,
                degraded=degraded,
                slowdown=est.nic_slowdown,
            )
        )
    if impact == "degraded":
        # Staying on the degraded link is the do-nothing choice (every collective slower until the link is clean
        # again); an action must beat it to be chosen.
        stay = _option(
            "stay_degraded",
            True,
            f"keep running on the degraded link (~{est.link_degraded_seconds:.0f} s "
            f"at {est.link_degraded_slowdown:.0%} slower)",
            job,
            pause=0.0,
            degraded=est.link_degraded_seconds,
            slowdown=est.link_degraded_slowdown,
        )
        found.append(stay)
    if impact == "risk":
        ok = situation.spare_node
        found.append(
            _option(
                "proactive_migration",
                ok,
                "move off the node before it fails" if ok else "no spare node",
                job,
                pause=est.migration_pause + situation.spare_wait_seconds,
            )
        )
        expected = (
            situation.risk
            * baseline_gpu_hours(
                gpus=job.gpus,
                seconds_since_checkpoint=job.seconds_since_checkpoint,
                restart_overhead_seconds=job.restart_overhead_seconds,
            )
            * 3600
            / max(job.gpus, 1)
        )
        found.append(
            _option("stay_at_risk", True, f"wait and see (risk {situation.risk:.2f})", job, pause=expected)
        )
    if situation.supports:
        found = [
            o
            if o.kind.startswith("stay_") or o.kind in situation.supports or not o.feasible
            else replace(o, feasible=False, why="the cluster's driver cannot do this")
            for o in found
        ]
    if situation.excluded:
        found = [
            replace(o, feasible=False, why="tried for this recovery, and it failed")
            if o.feasible and o.kind in situation.excluded
            else o
            for o in found
        ]
    return found


def plan(job: JobFacts, situation: Situation, est: Estimates) -> Plan:
    """Choose the feasible option with the fewest expected GPU-hours lost (ties: the order listed).

    ``chosen`` is None when nothing needs doing, or when staying put is cheapest (``stay_*``)."""
    options = options_for(job, situation, est)
    baseline = baseline_gpu_hours(
        gpus=job.gpus,
        seconds_since_checkpoint=job.seconds_since_checkpoint,
        restart_overhead_seconds=job.restart_overhead_seconds,
    )
    ranked = sorted(options, key=lambda o: (not o.feasible, o.gpu_hours_lost))
    chosen = ranked[0] if ranked and ranked[0].feasible else None
    if chosen is not None and chosen.kind.startswith("stay_"):
        return Plan(None, ranked, baseline, stay=chosen)
    return Plan(chosen, ranked, baseline)


# The recoveries that need a spare node (and room in the migration budget).
SPARE_KINDS = frozenset({"live_migration", "proactive_migration"})


def plan_with_spare_lookup(
    job: JobFacts, situation: Situation, est: Estimates, look_up: Callable[[], tuple[bool, float]]
) -> tuple[Plan, bool]:
    """``plan``, looking for a spare node only when one could change the choice.

    First price the recoveries as if a spare node were free now with no wait for the budget: the best a spare
    could do. If even then the cheapest recovery needs no spare, a real spare (taken, or after a wait) could only
    cost more, so the choice stands without reading the spare pool; the spare recoveries keep that best-case
    price and say they were not looked up. Otherwise ``look_up()`` gives (a spare is available, seconds to wait
    for the budget) and the plan is made with that. Returns the plan and whether the pool was looked up."""
    best_case = plan(job, replace(situation, spare_node=True, spare_wait_seconds=0.0), est)
    if best_case.chosen is not None and best_case.chosen.kind in SPARE_KINDS:
        available, wait = look_up()
        return plan(job, replace(situation, spare_node=available, spare_wait_seconds=wait), est), True
    cheaper = best_case.chosen.kind if best_case.chosen is not None else "staying put"
    note = f"spares not looked up: even with one free now it loses more than {cheaper}"
    options = [
        replace(o, why=f"{o.why}; {note}") if o.kind in SPARE_KINDS and o.feasible else o
        for o in best_case.options
    ]
    return Plan(best_case.chosen, options, best_case.baseline, stay=best_case.stay), False


def gpu_hours_at_stake(job: JobFacts) -> float:
    """What the job would lose if it had to restart from checkpoint: the order spares are handed out in."""
    return baseline_gpu_hours(
        gpus=job.gpus,
        seconds_since_checkpoint=job.seconds_since_checkpoint,
        restart_overhead_seconds=job.restart_overhead_seconds,
    )


TIER_WEIGHT = {"resilient": 2.0, "standard": 1.0}


def fair_order(requests: list[tuple[int, str, float, object]]) -> list[object]:
    """The order in which jobs get spares: weighted fair queuing between tenants by tier (a resilient tenant
    gets two turns for a standard tenant's one), and within a tenant the most GPU-hours at stake first.

    ``requests`` are (tenant_id, tier, gpu_hours_at_stake, key); returns the keys in order."""
    by_tenant: dict[int, list[tuple[float, object]]] = {}
    tiers: dict[int, str] = {}
    for tenant_id, tier, stake, key in requests:
        by_tenant.setdefault(tenant_id, []).append((stake, key))
        tiers[tenant_id] = tier
    slots = []
    for tenant_id, items in by_tenant.items():
        weight = TIER_WEIGHT.get(tiers[tenant_id], 1.0)
        for turn, (stake, key) in enumerate(sorted(items, key=lambda item: -item[0])):
            slots.append(((turn + 1) / weight, -stake, tenant_id, turn, key))
    return [slot[-1] for slot in sorted(slots, key=lambda slot: slot[:4])]
