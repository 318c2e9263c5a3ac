"""Per-node risk of failing soon, from features kept up to date as readings arrive (docs/prediction.md).

Pure functions: ``node_risk`` turns one node's features (and its rack's facility series) into a score in
[0, 1], the cause it attributes, and the evidence. Each piece of evidence is mapped to [0, 1] by a
saturating curve and the pieces combine as a noisy-OR, so one strong sign or several weak ones both raise
the score, and no sign leaves it at zero.
"""

import math
from dataclasses import dataclass, field

# weight of each kind of evidence: the probability it leads to a failure when fully present
WEIGHTS = {
    "thermal": 0.9,
    "ecc": 0.9,
    "remap": 0.9,
    "nvlink": 0.7,
    "nic": 0.8,
    "facility": 0.9,
    "throttle": 0.5,
    # the streaming detector's alarm on the node's own series (online.py): unusual for this node, which
    # alone is not a failure sign strong enough to cross the default threshold (0.8), but adds to others
    "anomaly": 0.6,
}


@dataclass
class NodeFeatures:
    node_id: int
    rack: str = ""
    temperature_max: float | None = None
    temperature_trend_max: float = 0.0  # °C per hour, the fastest-warming GPU
    sbe_rate_max: float = 0.0  # corrected ECC errors per hour
    remap_rate_max: float = 0.0  # remapped rows per hour
    nvlink_rate_max: float = 0.0  # NVLink errors per hour
    throttle_share_max: float = 0.0  # share of readings throttled for power or heat
    nic_symbol_rate_max: float = 0.0  # symbol errors per hour
    nic_recovery_rate_max: float = 0.0  # link error recoveries per hour
    hottest_gpu: int | None = None
    anomaly: float = 0.0  # 1 while the node's detector has an alarm raised (online.py)
    anomaly_cause: str = ""


@dataclass
class RackFacility:
    pressure_drop: float = 0.0  # fraction below the loop's baseline (0.2 = 20 % down)
    warming: float = 0.0  # °C per hour, the rack's GPUs on average


@dataclass
class Risk:
    score: float
    cause: str
    kind: str
    evidence: dict = field(default_factory=dict)


def _saturate(value: float, scale: float) -> float:
    return 1.0 - math.exp(-max(0.0, value) / scale) if scale > 0 else 0.0


def node_risk(features: NodeFeatures, rack: RackFacility | None = None) -> Risk:
    rack = rack or RackFacility()
    thermal = max(
        _saturate(features.temperature_trend_max - 2.0, 15.0),
        min(1.0, max(0.0, ((features.temperature_max or 0.0) - 82.0) / 12.0)),
    )
    evidence = {
        "thermal": thermal,
        "ecc": _saturate(features.sbe_rate_max, 300.0),
        "remap": _saturate(features.remap_rate_max, 2.0),
        "nvlink": _saturate(features.nvlink_rate_max, 500.0),
        "nic": max(
            _saturate(features.nic_symbol_rate_max, 2000.0), _saturate(features.nic_recovery_rate_max, 10.0)
        ),
        "throttle": min(1.0, features.throttle_share_max),
        # a loop losing pressure while the rack's GPUs warm together: one cause for the whole rack
        "facility": min(1.0, rack.pressure_drop / 0.25) * (1.0 if rack.warming > 1.0 else 0.5),
        "anomaly": min(1.0, max(0.0, features.anomaly)),
    }
    survive = 1.0
    for kind, strength in evidence.items():
        survive *= 1.0 - WEIGHTS[kind] * strength
    score = round(1.0 - survive, 4)
    kind = max(evidence, key=lambda k: WEIGHTS[k] * evidence[k])
    strength = evidence[kind]
    if strength < 0.05:
        return Risk(score, "no sign of trouble", "", {k: round(v, 3) for k, v in evidence.items()})
    gpu = f" on GPU {features.hottest_gpu}" if features.hottest_gpu is not None else ""
    cause = {
        "thermal": f"temperature rising {features.temperature_trend_max:.0f} °C/h{gpu} "
        f"(now {features.temperature_max or 0:.0f} °C)",
        "ecc": f"corrected ECC errors at {features.sbe_rate_max:.0f}/h",
        "remap": f"rows being remapped at {features.remap_rate_max:.1f}/h",
        "nvlink": f"NVLink errors at {features.nvlink_rate_max:.0f}/h",
        "nic": f"NIC symbol errors at {features.nic_symbol_rate_max:.0f}/h, link recoveries {features.nic_recovery_rate_max:.1f}/h",
        "throttle": f"throttled for power or heat {features.throttle_share_max:.0%} of the time",
        "facility": f"rack {features.rack}: cooling loop pressure {rack.pressure_drop:.0%} below normal while its GPUs "
        f"warm {rack.warming:.1f} °C/h",
        "anomaly": features.anomaly_cause or "readings unusual for this node",
    }[kind]
    return Risk(score, cause, kind, {k: round(v, 3) for k, v in evidence.items()})
