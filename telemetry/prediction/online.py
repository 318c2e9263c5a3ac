"""The anomaly detector online: each node's series run through ``StreamingDetector`` as the risk sweep sees them.

Every beat the sweep hands over each node's latest features (kept by ingest as readings arrive) and this module
folds them into one detector per node and series. Each detector's state (about 8 KB: two weeks of hourly
summaries) lives in one Redis hash, read and written back in one round trip each per beat; the sweep never goes
back to the samples. A node whose series has an alarm raised gets the ``anomaly`` evidence of ``risk.py``.

The series: the node's hottest GPU temperature, and its error rate (corrected ECC, NVLink and NIC symbol errors
per hour, added). The detector's configuration is the one ``bench/predictor_nab.py`` scores (``CONFIG``); a
detector learns for its first day (the baseline's length) before it may raise anything.
"""

import logging
import math

import redis
from django.conf import settings

from telemetry.prediction.detector import CONFIG, StreamingDetector, Verdict
from telemetry.prediction.risk import NodeFeatures

log = logging.getLogger(__name__)

HASH = "lockstep:predictor:detectors"
WARMUP_BLOCKS = CONFIG.baseline_blocks  # a day of hourly memory before the first alarm

SERIES = {
    "gpu_temperature": (lambda f: f.temperature_max, "hottest GPU temperature", "°C", "{:.0f}"),
    "error_rate": (
        lambda f: f.sbe_rate_max + f.nvlink_rate_max + f.nic_symbol_rate_max,
        "error rate",
        "/h",
        "{:.0f}",
    ),
}

_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)
    return _client


def _field(node_id: int, series: str) -> str:
    return f"{node_id}:{series}"


def phase(node_id: int, series: str) -> float:
    """Where this detector's hours begin: spread over the hour (whole minutes), so that at each beat only about a
    sixtieth of the fleet's detectors close an hour and recompute their baselines."""
    return 60.0 * ((node_id * 7 + list(SERIES).index(series) * 31) % 60)


def describe(series: str, verdict: Verdict, value: float) -> str:
    _, name, unit, number = SERIES[series]
    if not verdict.channel or math.isnan(verdict.baseline):
        return f"{name} unusual for this node in the last hours ({number.format(value)} {unit} now)"
    where = "above" if verdict.direction > 0 else "below"
    what = "its last hour" if verdict.channel in ("level", "slow") else "now"
    usual = "its two weeks' usual" if verdict.channel == "slow" else "its usual"
    return (
        f"{name} unusual for this node: {number.format(value)} {unit} {what}, {where} {usual} "
        f"{number.format(verdict.baseline)} {unit}"
    )


def observe(
    features: dict[int, NodeFeatures],
    now: float,
    *,
    connection: redis.Redis | None = None,
    prune: bool = False,
) -> int:
    """Fold each node's current features (at ``now``, epoch seconds) into its detectors and set each node's
    ``anomaly`` (strongest verdict across its series) and ``anomaly_cause``. Returns the alarms raised now.
    ``prune`` drops the state of nodes no longer in ``features`` (a full sweep knows every node)."""
    connection = connection or client()
    fields = [_field(node_id, series) for node_id in features for series in SERIES]
    if not fields:
        return 0
    blobs = connection.hmget(HASH, fields)
    updated, raised = {}, 0
    index = 0
    for node_id, f in features.items():
        strongest, cause = 0.0, ""
        for series, (value_of, *_rest) in SERIES.items():
            blob = blobs[index]
            index += 1
            value = value_of(f)
            if value is None or not math.isfinite(value):
                continue
            try:
                detector = StreamingDetector.from_bytes(blob) if blob else None
            except ValueError:
                detector = None  # a state from another configuration: start again
            detector = detector or StreamingDetector(CONFIG, phase=phase(node_id, series))
            verdict = detector.update(now, value, detect=detector.blocks >= WARMUP_BLOCKS)
            updated[_field(node_id, series)] = detector.to_bytes()
            raised += verdict.new
            # the evidence is the alarm: a sub-threshold excursion is what every node shows now and then
            if verdict.alarm and not cause:
                strongest, cause = 1.0, describe(series, verdict, value)
        f.anomaly, f.anomaly_cause = strongest, cause
    pipe = connection.pipeline(transaction=False)
    pipe.hset(HASH, mapping=updated)
    if prune:
        keep = set(fields)
        stale = [name for name in connection.hkeys(HASH) if name.decode() not in keep]
        if stale:
            pipe.hdel(HASH, *stale)
    pipe.execute()
    return raised


def forget(node_ids, *, connection: redis.Redis | None = None) -> None:
    """Drop the detectors of these nodes (a node removed, a test cleaning up)."""
    fields = [_field(node_id, series) for node_id in node_ids for series in SERIES]
    if fields:
        (connection or client()).hdel(HASH, *fields)
