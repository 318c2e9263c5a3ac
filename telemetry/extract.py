"""Hard faults and features from successive readings: pure functions, no database.

A *fault candidate* is handed to jobs' ``fault_ingest``, whose triage (the Xid catalogue, the NIC rules)
decides what it means. Features are exponentially weighted so the predictor reads them without going back
to the raw samples (docs/prediction.md).
"""

import math
from dataclasses import dataclass, field

from jobs.triage import LINK_RECOVERIES_DEGRADED, NicFaultDetails

# Half-life of the EWMA features, in readings (about ten minutes at one reading every ten seconds).
EWMA_ALPHA = 0.1
THROTTLE_THERMAL_OR_POWER = 0x4 | 0x20 | 0x40 | 0x80  # SW power cap, SW thermal, HW thermal, HW power brake

NVLINK_FIELDS = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)


@dataclass
class FaultCandidate:
    kind: str
    node_id: int
    ts: float
    gpu_index: int | None = None
    nic_name: str | None = None
    xid: int | None = None
    details: dict = field(default_factory=dict)


FAST_SECONDS, SLOW_SECONDS = 120.0, 1200.0  # time constants of the temperature averages


def _ewma_time(old: float | None, new: float, seconds: float, tau: float) -> float:
    """An average with a time constant, right whatever the spacing of readings."""
    if old is None or seconds <= 0:
        return new if old is None else old
    weight = 1.0 - math.exp(-seconds / tau)
    return old + weight * (new - old)


def _ewma(old: float | None, new: float, alpha: float = EWMA_ALPHA) -> float:
    return new if old is None else old + alpha * (new - old)


def _per_hour(delta: float, seconds: float) -> float:
    return delta * 3600.0 / seconds if seconds > 0 else 0.0


def _count(state: dict, total_key: str, rate_key: str, value, seconds: float, first: bool) -> float:
    """Fold a cumulative counter into ``state``: its per-hour rate (EWMA) from the increase since the last
    reading, and the counter itself. Returns the increase (0 for the first reading or a missing value)."""
    if value is None:
        return 0
    increase = 0 if first else value - state.get(total_key, 0)
    if not first and seconds > 0:
        state[rate_key] = _ewma(state.get(rate_key, 0.0), _per_hour(max(0, increase), seconds))
    state[total_key] = value
    return increase


def nvlink_total(fields: dict) -> int | None:
    """All NVLink error counters of a reading added up, or None when it carries none."""
    present = [fields[name] for name in NVLINK_FIELDS if name in fields]
    return int(sum(present)) if present else None


def gpu_step(
    prev: dict | None, ts: float, fields: dict, *, thermal_limit: float
) -> tuple[dict, list[tuple[str, dict]]]:
    """Fold one GPU reading into its state. Returns the new state and (kind, details) fault candidates."""
    temperature = fields.get("DCGM_FI_DEV_GPU_TEMP")
    sbe = fields.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    dbe = fields.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
    remapped = fields.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")
    nvlink = nvlink_total(fields)
    recovery_errors = fields.get("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")
    throttle = int(fields.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") or 0)
    state = (
        dict(prev)
        if prev
        else {
            "ts": None,
            "temperature_ewma": None,
            "temperature_slow": None,
            "temperature_trend": 0.0,
            "sbe_rate": 0.0,
            "remap_rate": 0.0,
            "nvlink_rate": 0.0,
            "throttle_share": 0.0,
            "samples": 0,
            "sbe_total": 0,
            "dbe_total": 0,
            "remapped_rows": 0,
            "nvlink_errors": 0,
            "temperature": None,
            "recovery_errors": 0,
        }
    )
    faults: list[tuple[str, dict]] = []
    seconds = ts - state["ts"] if state["ts"] is not None else 0.0
    first = state["ts"] is None
    if temperature is not None:
        # The trend is the gap between a fast and a slow average over the gap between their lags: for a steady
        # ramp it tends to the slope, and reading-to-reading noise (which differencing would magnify) averages out.
        fast = _ewma_time(state["temperature_ewma"], temperature, seconds, FAST_SECONDS)
        slow = _ewma_time(state.get("temperature_slow"), temperature, seconds, SLOW_SECONDS)
        state["temperature_ewma"], state["temperature_slow"] = fast, slow
        state["temperature_trend"] = (fast - slow) * 3600.0 / (SLOW_SECONDS - FAST_SECONDS)
        if temperature >= thermal_limit and (
            state["temperature"] is None or state["temperature"] < thermal_limit
        ):
            faults.append(("thermal", {"temperature_celsius": temperature, "limit_celsius": thermal_limit}))
        state["temperature"] = temperature
    _count(state, "sbe_total", "sbe_rate", sbe, seconds, first)
    if dbe is not None:
        if not first and dbe > state["dbe_total"]:
            faults.append(("ecc_uncorrectable", {"dbe_before": state["dbe_total"], "dbe_now": dbe}))
        state["dbe_total"] = dbe
    _count(state, "remapped_rows", "remap_rate", remapped, seconds, first)
    _count(state, "nvlink_errors", "nvlink_rate", nvlink, seconds, first)
    if recovery_errors is not None:
        if not first and recovery_errors > state.get("recovery_errors", 0):
            faults.append(
                (
                    "nvlink_error",
                    {
                        "recovery_errors_before": state.get("recovery_errors", 0),
                        "recovery_errors_now": recovery_errors,
                    },
                )
            )
        state["recovery_errors"] = recovery_errors
    state["throttle_share"] = _ewma(
        state["throttle_share"], 1.0 if throttle & THROTTLE_THERMAL_OR_POWER else 0.0
    )
    state["throttle_reasons"] = throttle
    state["samples"] += 1
    state["ts"] = ts
    return state, faults


def _new_nic_state() -> dict:
    """The state of a NIC before its first reading: link up, every counter and rate at zero."""
    return {
        "ts": None,
        "link_state": "up",
        "link_downed": 0,
        "symbol_errors": 0,
        "link_error_recovery": 0,
        "port_rcv_errors": 0,
        "symbol_rate": 0.0,
        "recovery_rate": 0.0,
        "rcv_error_rate": 0.0,
        "down_seconds": 0.0,
        "flaps": 0,
        "congestion_rate": 0.0,
        "xmit_wait": 0,
        "errors_at": None,
    }


def _nic_down(state: dict, link_state: str, downed, first: bool) -> tuple[int, list[tuple[str, dict]]]:
    """Fold the link-downed counter into ``state`` (each new down a flap). Returns how many times the link went
    down since the last reading and the ``nic_down`` fault candidate, if any: raised on an increase of the counter,
    or on a link newly seen down."""
    faults: list[tuple[str, dict]] = []
    went_down = 0
    if downed is not None:
        if not first and downed > state["link_downed"]:
            went_down = int(downed - state["link_downed"])
            state["flaps"] += went_down
            faults.append(
                (
                    "nic_down",
                    NicFaultDetails(
                        link_state=link_state if link_state in ("up", "down") else None,
                        link_downed=went_down,
                        downtime_seconds=round(state["down_seconds"], 1),
                        flaps=state["flaps"],
                    ).as_details(),
                )
            )
        state["link_downed"] = downed
    if link_state == "down" and state["link_state"] != "down" and not any(k == "nic_down" for k, _ in faults):
        faults.append(
            (
                "nic_down",
                NicFaultDetails(
                    link_state="down", downtime_seconds=round(state["down_seconds"], 1), flaps=state["flaps"]
                ).as_details(),
            )
        )
    return went_down, faults


def nic_step(
    prev: dict | None, ts: float, link_state: str, fields: dict, *, symbol_rate_limit: float
) -> tuple[dict, list[tuple[str, dict]]]:
    """Fold one NIC reading into its state: any increase in link-downed is fatal; symbol errors above a rate or
    repeated link error recovery mean degraded; time spent down accumulates (it counts more than flaps).
    ``errors_at`` is the time of the last reading with the link down or any new error: a link is clean again when
    it has stayed up with no new error for a while after it. Fault details follow ``NicFaultDetails``."""
    state = dict(prev) if prev else _new_nic_state()
    first = state["ts"] is None
    seconds = ts - state["ts"] if not first else 0.0
    downed = fields.get("link_downed")
    symbols = fields.get("symbol_error")
    recoveries = fields.get("link_error_recovery")
    rcv = fields.get("port_rcv_errors")
    if not first and state["link_state"] == "down" and seconds > 0:
        state["down_seconds"] += seconds
    went_down, faults = _nic_down(state, link_state, downed, first)
    rate_before = state["symbol_rate"]
    new_symbols = _count(state, "symbol_errors", "symbol_rate", symbols, seconds, first)
    new_recoveries = (
        0 if first else _count(state, "link_error_recovery", "recovery_rate", recoveries, seconds, first)
    )
    if first:
        _count(state, "link_error_recovery", "recovery_rate", recoveries, seconds, first)
    _count(state, "xmit_wait", "congestion_rate", fields.get("port_xmit_wait"), seconds, first)
    _count(state, "port_rcv_errors", "rcv_error_rate", rcv, seconds, first)
    repeated = new_recoveries >= LINK_RECOVERIES_DEGRADED
    crossed = (
        rate_before <= symbol_rate_limit < state["symbol_rate"]
    )  # report the crossing, not every reading
    if link_state == "up" and (repeated or crossed) and not faults:
        faults.append(
            (
                "link_degraded",
                NicFaultDetails(
                    link_state="up",
                    symbol_rate_per_hour=round(state["symbol_rate"], 1),
                    link_error_recoveries=int(max(0, new_recoveries)),
                ).as_details(),
            )
        )
    if link_state != "up" or went_down or new_symbols > 0 or new_recoveries > 0:
        state["errors_at"] = ts
    state["link_state"] = link_state
    state["ts"] = ts
    return state, faults


def facility_step(prev: dict | None, ts: float, value: float) -> dict:
    """Latest value, a fast EWMA, a slow baseline and the trend per hour of a facility series."""
    if prev is None:
        return {"ts": ts, "value": value, "ewma": value, "baseline": value, "trend": 0.0}
    seconds = ts - prev["ts"]
    trend = prev["trend"]
    if seconds > 0:
        trend = _ewma(prev["trend"], _per_hour(value - prev["value"], seconds))
    return {
        "ts": ts,
        "value": value,
        "ewma": _ewma(prev["ewma"], value),
        "baseline": _ewma(prev["baseline"], value, 0.01),
        "trend": trend,
    }
