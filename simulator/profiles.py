"""The fault model: how often interruptions strike and what their root causes are, from published data.

Rates per GPU-hour come from a named profile:

- ``llama3``: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Llama 3 405B pre-training),
  about one every 3.1 h at that scale.
- ``rsc1`` / ``rsc2``: Meta's node failure rates, 6.50 and 2.34 per 1,000 node-days (RSC-1, RSC-2), with
  8 GPUs per node.

The published figures do not agree with each other: a constant per-GPU rate cannot give both Meta's 7.9 h
mean time to failure at 1,024 GPUs and 1.8 h at 16,384 (docs/simulator.md has the arithmetic). The profile
decides. Root causes are drawn from the Llama 3 interruption mix (the counts; the printed percentages do not
add up, see shared/data/failures/llama3_SOURCE.md) and each maps to what Lockstep would see.
"""

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

DATA = Path(settings.BASE_DIR).parent / "shared" / "data" / "failures"


@dataclass(frozen=True)
class Profile:
    name: str
    rate_per_gpu_hour: float
    source: str

    def mean_hours_between(self, gpus: int) -> float:
        return 1.0 / (self.rate_per_gpu_hour * gpus)


PROFILES = {
    "llama3": Profile("llama3", 419 / (54 * 24 * 16_384), "419 unexpected interruptions / 54 days / 16,384 GPUs"),
    "rsc1": Profile("rsc1", 6.50 / 1000 / 24 / 8, "6.50 node failures per 1,000 node-days (RSC-1), 8 GPUs per node"),
    "rsc2": Profile("rsc2", 2.34 / 1000 / 24 / 8, "2.34 node failures per 1,000 node-days (RSC-2), 8 GPUs per node"),
}


@dataclass(frozen=True)
class Manifestation:
    """How a root cause shows itself to Lockstep: the fault kind, an Xid where one applies, whether it can be
    preceded by a precursor (temperature creep, rising corrected ECC, NIC symbol errors) and which."""

    kind: str
    xid: int | None = None
    precursor: str = ""   # "thermal", "ecc", "nic", "facility" or ""
    channel: str = "agent"  # "agent" (telemetry), "alertmanager" (node down), "job" (the job crashes)


# Root cause (Llama 3 Table 5 component) -> what Lockstep sees. Xid codes from NVIDIA's catalogue:
# 79 fallen off the bus, 48 double-bit ECC, 94/95 contained/uncontained ECC, 119 GSP timeout.
MANIFESTATIONS = {
    "Faulty GPU": Manifestation("gpu_xid", 79, "thermal"),
    "GPU HBM3 Memory": Manifestation("ecc_uncorrectable", 48, "ecc"),
    "Software Bug": Manifestation("software_crash", channel="job"),
    "Network Switch/Cable": Manifestation("nic_down", precursor="nic"),
    "Host Maintenance": Manifestation("node_unreachable", channel="alertmanager"),
    "GPU SRAM Memory": Manifestation("gpu_xid", 95, "ecc"),
    "GPU System Processor": Manifestation("gpu_xid", 119),
    "NIC": Manifestation("nic_down", precursor="nic"),
    "NCCL Watchdog Timeouts": Manifestation("software_crash", channel="job"),
    "Silent Data Corruption": Manifestation("software_crash", channel="job"),
    "GPU Thermal Interface + Sensor": Manifestation("thermal", precursor="facility"),
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


@functools.cache
def root_cause_mix() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Components and their interruption counts, from the published table (419 in all)."""
    with (DATA / "llama3_405b_unexpected_interruptions.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return tuple(r["component"] for r in rows), tuple(int(r["interruption_count"]) for r in rows)


def manifestation(component: str) -> Manifestation:
    return MANIFESTATIONS[component]
