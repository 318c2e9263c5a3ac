"""What the what-if assumes, in the open: every assumption with its value and source, and the sensitivity rows.

An assumption's source is a paper (with the figure it comes from), the seed, or "assumed" — a value no
published figure in data/failures gives, chosen by us and moved in the sensitivity table. The sensitivity
table moves each main assumption to a pessimistic and an optimistic value, one row each, and replays the same
sampled fault trace (the same seed: common random numbers), so a row's difference comes from the assumption,
not from sampling noise.
"""

from dataclasses import dataclass

from simulator.profiles import PROFILES, software_share

LLAMA3 = "Llama 3 (arXiv:2407.21783)"
KOKOLIS = "Kokolis et al., arXiv:2410.21680 (Meta RSC)"


@dataclass(frozen=True)
class Row:
    """One row of the sensitivity table: a config field, its pessimistic and optimistic values, and why."""

    field: str
    label: str
    unit: str
    pessimistic: float
    optimistic: float
    why: str


SENSITIVITY = (
    Row(
        "migration_pause_seconds",
        "migration pause",
        "s",
        600,
        10,
        "600 s: detection waits for PyTorch's NCCL watchdog (8-10 min); 10 s: a fast in-memory handover",
    ),
    Row(
        "migration_work_lost_minutes",
        "work lost per migration off a dead node",
        "min",
        30,
        0,
        "30 min: no snapshot newer than the checkpoint; 0: a dead node's state survives (the old replay)",
    ),
    Row(
        "spare_fraction",
        "spare share",
        "share of nodes",
        0.005,
        0.05,
        "0.5 % (ten nodes) to 5 % of the job's nodes",
    ),
    Row(
        "repair_hours",
        "repair time",
        "h (mean)",
        168,
        4,
        "a week (vendor parts, RMA) to four hours (reboot, reseat)",
    ),
    Row(
        "software_crash_share",
        "software-crash share",
        "share of interruptions",
        0.33,
        0.08,
        "double and half Table 5's 16.5 %",
    ),
    Row(
        "checkpoint_minutes",
        "checkpoint interval",
        "min",
        60,
        10,
        f"60 min: the interval {KOKOLIS} assume; 10 min",
    ),
    Row("restart_overhead_minutes", "restart overhead", "min", 20, 5, f"5-20 min, the range {KOKOLIS} use"),
    Row(
        "failed_recovery_share",
        "failed recoveries",
        "share of Lockstep recoveries",
        0.20,
        0.0,
        "one in five Lockstep recoveries fails and falls back; none does",
    ),
    Row(
        "rack_failure_share",
        "correlated rack failures",
        "share of node faults",
        0.20,
        0.0,
        "a fifth of node-level faults take their whole rack; none does",
    ),
    Row(
        "checkpoint_write_seconds",
        "checkpoint write cost",
        "s",
        120,
        5,
        "synchronous writes to slower storage; fully asynchronous checkpoints",
    ),
)


def value_of(config, field: str) -> float:
    """A config field's value as the replay uses it (the software-crash share defaults to Table 5's)."""
    value = getattr(config, field)
    if field == "software_crash_share" and value is None:
        return round(software_share(), 4)
    return value


def _item(name, value, unit, source) -> dict:
    return {"name": name, "value": value, "unit": unit, "source": source}


def assumptions(config) -> list[dict]:
    """Every assumption of a replay of ``config``: name, value, unit, source."""
    return [
        *_fault_model(config),
        *_recovery_costs(config),
        *_checkpoint_costs(config),
        *_spares_and_repair(config),
        *_correlated_and_lemons(config),
    ]


def _fault_model(config) -> list[dict]:
    """The fault model: how often the job is interrupted, by what, and for which seed."""
    profile = PROFILES[config.profile]
    sw = value_of(config, "software_crash_share")
    table5 = config.software_crash_share is None
    return [
        _item(
            "interruption rate",
            f"{profile.rate_per_gpu_hour:.3g}",
            "per GPU-hour",
            f"{profile.source} ({profile.name})",
        ),
        _item(
            "root-cause mix",
            "Table 5 counts (Faulty GPU 148 of 419)",
            "",
            f"{LLAMA3} Table 5; the counts, not the printed 30.1 %: they add up to the 419 of the text and every "
            "other row's count/419 equals its percentage, while the printed percentages add up to 94.9",
        ),
        _item(
            "software-crash share",
            sw,
            "share of interruptions",
            f"{LLAMA3} Table 5: software bug, NCCL watchdog, silent data corruption, dependency = 69/419"
            if table5
            else "assumed (sensitivity)",
        ),
        _item(
            "software crashes restart from the checkpoint even with protection",
            "yes",
            "",
            "assumed: a snapshot taken before a bug or a silent data corruption may carry it",
        ),
        _item("seed", config.seed, "", "the seed: same seed, same fault trace"),
    ]


def _recovery_costs(config) -> list[dict]:
    """What Lockstep's recoveries cost: migrations and NIC failovers."""
    return [
        _item(
            "migration pause",
            config.migration_pause_seconds,
            "s",
            "assumed (the planner's default estimate; Clockwork reports TorchPass recoveries under two minutes)",
        ),
        _item(
            "work lost per migration off a dead node",
            config.migration_work_lost_minutes,
            "min",
            "assumed: one snapshot interval of the protection runtime (the stated default; never more than the "
            "time since the checkpoint)",
        ),
        _item(
            "work lost per migration off a live node (NIC down, hot GPU)",
            0,
            "min",
            "assumed: the node still answers, its workers' state is copied",
        ),
        _item(
            "NIC failover",
            "1 s pause, then 1 % slower for 30 min",
            "",
            "assumed (the planner's default estimates)",
        ),
    ]


def _checkpoint_costs(config) -> list[dict]:
    """What checkpoints and whole-job restarts cost."""
    return [
        _item("checkpoint interval", config.checkpoint_minutes, "min", "config"),
        _item(
            "checkpoint write cost",
            config.checkpoint_write_seconds,
            "s",
            f"derived from {LLAMA3} s3.3: up to 4 GB a GPU written to Tectonic at 2 TB/s sustained, "
            "16,384 x 4 GB / 2 TB/s = 33 s; snapshots are in memory and assumed free",
        ),
        _item(
            "restart overhead",
            config.restart_overhead_minutes,
            "min",
            f"the cluster setting's default (docs/gpu-hours.md); {KOKOLIS} use 5-20 min",
        ),
    ]


def _spares_and_repair(config) -> list[dict]:
    """The spares, the repair of failed nodes, and recoveries that fail."""
    return [
        _item("spare share", config.spare_fraction, "share of the job's nodes", "assumed"),
        _item(
            "repair time",
            config.repair_hours,
            "h, mean of an exponential",
            "assumed: no repair times are published in data/failures",
        ),
        _item(
            "failed recoveries",
            config.failed_recovery_share,
            "share of Lockstep recoveries",
            "assumed (the demo world fails 5 % of recovery operations); a failed one costs its pause, then "
            "the planner's next option",
        ),
    ]


def _correlated_and_lemons(config) -> list[dict]:
    """Failures that take several nodes at once, lemon nodes, and how spares are ranked."""
    return [
        _item(
            "rack failures",
            config.rack_failure_share,
            "share of node-level faults",
            "assumed: a rack's power or cooling takes its 8 nodes at once; several nodes at once is a "
            "whole-job restart for the planner",
        ),
        _item(
            "leaf switch failures",
            config.leaf_failure_share,
            "share of switch/cable faults",
            f"assumed: a leaf switch takes one rail NIC of each of its {config.nodes_per_leaf} nodes (rail-optimised "
            "fabric); with protection their traffic fails over to the other rails",
        ),
        _item(
            "lemon nodes",
            config.lemon_node_share,
            "share of nodes",
            f"{KOKOLIS}: 24 lemon nodes, 1.2 % of RSC-1",
        ),
        _item(
            "hardware faults on lemon nodes",
            config.lemon_fault_share,
            "share",
            f"derived from {KOKOLIS}: removing lemons cut 512+ GPU jobs' failure rate from 14 % to 4 %, (14-4)/14",
        ),
        _item(
            "a lemon is retired after",
            config.lemon_retire_after,
            "failures",
            "assumed (Meta's lemon detection, >85 % accurate, takes the node out for good)",
        ),
        _item(
            "one job owns the cluster; spares are ranked by Lockstep's placement",
            "yes",
            "",
            "jobs.placement.spare_order_key: same leaf, same rack, lowest risk (a node's past failures)",
        ),
    ]
