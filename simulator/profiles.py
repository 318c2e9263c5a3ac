"""The fault model: how often interruptions strike and what their root causes are, from published data.

Rates per GPU-hour come from a named profile:

- ``llama3``: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Llama 3 405B pre-training),
  about one every 3.1 h at that scale.
- ``rsc1`` / ``rsc2``: Meta's node failure rates, 6.50 and 2.34 per 1,000 node-days (RSC-1, RSC-2), with
  8 GPUs per node.

The published figures do not agree with each other: a constant per-GPU rate cannot give both Meta's 7.9 h
mean time to failure at 1,024 GPUs and 1.8 h at 16,384 (docs/simulator.md has the arithmetic). The profile
decides. Root causes are drawn from the Llama 3 interruption mix and each maps to what Lockstep would see.

Table 5 disagrees with itself on "Faulty GPU": 148 interruptions, printed as 30.1 % (148/419 is 35.3 %). We follow
the **counts**: they add up to the 419 the text states, every other row's count/419 equals its printed percentage,
and the printed percentages add up to 94.9, not 100 (data/failures/llama3_SOURCE.md). The text's "GPU issues
58.7 %" therefore does not hold here (the counts give 64.0 %).
"""

import csv
import functools
from dataclasses import dataclass

from controlplane import data


@dataclass(frozen=True)
class Profile:
    name: str
    rate_per_gpu_hour: float
    source: str

    def mean_hours_between(self, gpus: int) -> float:
        return 1.0 / (self.rate_per_gpu_hour * gpus)

    def mttf_hours(self, gpus: int) -> float:
        """A job's mean time to failure at ``gpus`` GPUs: Meta's model, MTTF = 1 / (N_nodes x r_f), which is
        the same as one over the per-GPU rate times the job's GPUs."""
        return self.mean_hours_between(gpus)


PROFILES = {
    "llama3": Profile(
        "llama3", 419 / (54 * 24 * 16_384), "419 unexpected interruptions / 54 days / 16,384 GPUs"
    ),
    "rsc1": Profile(
        "rsc1", 6.50 / 1000 / 24 / 8, "6.50 node failures per 1,000 node-days (RSC-1), 8 GPUs per node"
    ),
    "rsc2": Profile(
        "rsc2", 2.34 / 1000 / 24 / 8, "2.34 node failures per 1,000 node-days (RSC-2), 8 GPUs per node"
    ),
}


@dataclass(frozen=True)
class Manifestation:
    """How a root cause shows itself to Lockstep: the fault kind, an Xid where one applies, whether it can be
    preceded by a precursor (temperature creep, rising corrected ECC, NIC symbol errors) and which."""

    kind: str
    xid: int | None = None
    precursor: str = ""  # "thermal", "ecc", "nic", "facility" or ""
    channel: str = "agent"  # "agent" (telemetry), "alertmanager" (node down), "job" (the job crashes)
    # Whether the workers' state on the node is gone: a dead GPU or node cannot hand its memory to a spare, so a
    # migration restores the worker from the protection runtime's last snapshot. A NIC going down or a GPU
    # running hot leaves the node alive, and its workers move without losing progress.
    state_lost: bool = True


# Root cause (Llama 3 Table 5 component) -> what Lockstep sees. Xid codes from NVIDIA's catalogue:
# 79 fallen off the bus, 48 double-bit ECC, 94/95 contained/uncontained ECC, 119 GSP timeout.
MANIFESTATIONS = {
    "Faulty GPU": Manifestation("gpu_xid", 79, "thermal"),
    "GPU HBM3 Memory": Manifestation("ecc_uncorrectable", 48, "ecc"),
    "Software Bug": Manifestation("software_crash", channel="job"),
    "Network Switch/Cable": Manifestation("nic_down", precursor="nic", state_lost=False),
    "Host Maintenance": Manifestation("node_unreachable", channel="alertmanager"),
    "GPU SRAM Memory": Manifestation("gpu_xid", 95, "ecc"),
    "GPU System Processor": Manifestation("gpu_xid", 119),
    "NIC": Manifestation("nic_down", precursor="nic", state_lost=False),
    "NCCL Watchdog Timeouts": Manifestation("software_crash", channel="job"),
    "Silent Data Corruption": Manifestation("software_crash", channel="job"),
    "GPU Thermal Interface + Sensor": Manifestation("thermal", precursor="facility", state_lost=False),
    "SSD": Manifestation("node_unreachable", channel="alertmanager"),
    "Power Supply": Manifestation("node_unreachable", channel="alertmanager"),
    "Server Chassis": Manifestation("node_unreachable", channel="alertmanager"),
    "IO Expansion Board": Manifestation("node_unreachable", channel="alertmanager"),
    "Dependency": Manifestation("software_crash", channel="job"),
    "CPU": Manifestation("node_unreachable", channel="alertmanager"),
    "System Memory": Manifestation("node_unreachable", channel="alertmanager"),
}
# Share of hardware faults preceded by a precursor the predictor can find (the rest strike without warning).
PRECURSOR_SHARE = 0.5


SOFTWARE_COMPONENTS = frozenset(
    name for name, seen in MANIFESTATIONS.items() if seen.kind == "software_crash"
)
# Correlated failures: which root causes can take more than one node at once. A rack's power or cooling takes its
# nodes together (several nodes for the job: a whole-job restart); a leaf switch takes one rail NIC of each node
# under it (rail-optimised fabric: the nodes live on, their traffic can fail over to the other rails).
RACK_COMPONENTS = frozenset(name for name, seen in MANIFESTATIONS.items() if seen.kind == "node_unreachable")
LEAF_COMPONENTS = frozenset({"Network Switch/Cable"})


@functools.cache
def root_cause_mix() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Components and their interruption counts, from the published table (419 in all)."""
    with (data.failures_dir() / "llama3_405b_unexpected_interruptions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return tuple(r["component"] for r in rows), tuple(int(r["interruption_count"]) for r in rows)


def software_share() -> float:
    """The share of Table 5's interruptions that are software crashes no migration can save (69 of 419)."""
    components, counts = root_cause_mix()
    return sum(n for c, n in zip(components, counts, strict=True) if c in SOFTWARE_COMPONENTS) / sum(counts)


def root_cause_weights(software: float | None = None) -> tuple[float, ...]:
    """Table 5's counts as weights, with the software-crash rows scaled together to ``software`` of the total
    (None: as published) and the hardware rows to the rest, each group keeping its own proportions."""
    components, counts = root_cause_mix()
    if software is None:
        return tuple(float(n) for n in counts)
    total = sum(counts)
    soft = sum(n for c, n in zip(components, counts, strict=True) if c in SOFTWARE_COMPONENTS)
    return tuple(
        n * (software * total / soft if c in SOFTWARE_COMPONENTS else (1 - software) * total / (total - soft))
        for c, n in zip(components, counts, strict=True)
    )


@functools.cache
def meta_rsc_figures() -> dict[str, tuple[float, str, str]]:
    """Kokolis et al.'s figures by metric and cluster: ``"metric/cluster" -> (value, unit, kind)`` (numeric only)."""
    with (data.failures_dir() / "meta_rsc_reliability_figures.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    figures = {}
    for row in rows:
        try:
            figures[f"{row['metric']}/{row['cluster']}"] = (float(row["value"]), row["unit"], row["kind"])
        except ValueError:
            continue
    return figures


def manifestation(component: str) -> Manifestation:
    return MANIFESTATIONS[component]
