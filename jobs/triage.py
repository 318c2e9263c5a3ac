"""Triage: what a fault means for the hardware, driven by NVIDIA's Xid catalogue, read at run time.

Pure functions (no database): telemetry reuses ``classify_xid`` for its own ingest. The verdict of a code
comes from the catalogue's ``recommended_action`` column (data/xid/nvidia_xid_catalog.csv), never
from a list of codes kept here; only the *meaning of each action bucket* is written down below.
"""

import csv
import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings


@dataclass(frozen=True)
class XidVerdict:
    """The triage of one Xid code.

    ``out_of_service``: the GPU must stop serving jobs (its job moves away; the node climbs the ladder).
    ``escalates``: the event counts toward the node's escalation ladder (repeated ones quarantine it).
    ``needs_human``: the catalogue gives no automatic remedy; someone must look.
    ``application``: an application error; the hardware is healthy and only the job restarts.
    ``remediation``: what the ladder does once the node is drained: ``gpu_reset``, ``reboot`` or ``""``.
    """

    xid: int
    mnemonic: str
    meaning: str
    recommended_action: str
    out_of_service: bool
    escalates: bool
    needs_human: bool
    application: bool
    ignore: bool
    remediation: str
    in_catalogue: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


# The meaning of each recommended-action bucket of NVIDIA's catalogue:
# (out_of_service, escalates, needs_human, application, ignore, remediation)
ACTION_BUCKETS: dict[str, tuple[bool, bool, bool, bool, bool, str]] = {
    "RESTART_APP": (False, False, False, True, False, ""),
    "IGNORE": (False, False, False, True, True, ""),
    # Xid 45 is preemptive cleanup after another error: follow that Xid, the hardware is fine.
    "WORKFLOW_XID_45": (False, False, False, True, False, ""),
    "CHECK_UVM": (False, False, False, True, False, ""),
    "RESET_GPU": (True, True, False, False, False, "gpu_reset"),
    "WORKFLOW_XID_48": (True, True, False, False, False, "gpu_reset"),
    "RESTART_BM": (True, True, False, False, False, "reboot"),
    "RESTART_VM": (True, True, False, False, False, "reboot"),
    "WORKFLOW_NVLINK_ERR": (True, True, False, False, False, "reboot"),
    "WORKFLOW_NVLINK5_ERR": (True, True, False, False, False, "reboot"),
    "CHECK_MECHANICALS": (True, True, True, False, False, ""),
    "XID_154": (True, True, True, False, False, ""),
    "CONTACT_SUPPORT": (False, True, True, False, False, ""),
    "UPDATE_SWFW": (False, True, True, False, False, ""),
}
# A code with no recommended action (or an action this table does not know) is kept, escalates, and is
# flagged for a human.
UNKNOWN_BUCKET = (False, True, True, False, False, "")


def catalogue_path() -> Path:
    from controlplane import data

    return data.xid_catalogue()


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[int, dict]:
    with open(path, newline="") as handle:
        return {int(row["xid"]): row for row in csv.DictReader(handle)}


def catalogue() -> dict[int, dict]:
    """The catalogue rows by code, read from disk once per process."""
    return _load(str(catalogue_path()))


def classify_xid(xid: int, rows: dict[int, dict] | None = None) -> XidVerdict:
    """The verdict for one Xid code from the catalogue's recommended action."""
    rows = catalogue() if rows is None else rows
    row = rows.get(int(xid))
    if row is None:
        out, esc, human, app, ignore, remedy = UNKNOWN_BUCKET
        return XidVerdict(
            int(xid), "", "not in the catalogue", "", out, esc, human, app, ignore, remedy, False
        )
    action = (row.get("recommended_action") or "").strip()
    out, esc, human, app, ignore, remedy = ACTION_BUCKETS.get(action, UNKNOWN_BUCKET)
    mnemonic = row.get("mnemonic", "")
    if action == "RESTART_APP" and "CONTAINED_ERROR" in mnemonic and "UNCONTAINED" not in mnemonic:
        # A contained memory error (Xid 94): the application restarts, but the GPU's memory is suspect.
        esc = True
    return XidVerdict(
        int(xid), mnemonic, row.get("meaning", ""), action, out, esc, human, app, ignore, remedy
    )


@dataclass(frozen=True)
class FaultVerdict:
    """What a fault of any kind means: for the job on the device, for the device, and for the ladder."""

    job_impact: str  # "none", "restart" (app crashed), "device" (a GPU is gone), "node" (the whole node),
    # "nic" (one NIC down), "degraded" (slower), "risk" (may fail soon)
    out_of_service: bool
    escalates: bool
    needs_human: bool
    remediation: str
    recommended_action: str = ""
    ignore: bool = False
    explanation: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def classify_fault(kind: str, *, xid: int | None = None, details: dict | None = None) -> FaultVerdict:
    """Triage of a fault event by kind (and Xid code, and NIC counters in ``details``)."""
    details = details or {}
    if kind == "gpu_xid":
        if xid is None:
            return FaultVerdict("none", False, True, True, "", explanation="gpu_xid without a code")
        v = classify_xid(xid)
        impact = (
            "device"
            if v.out_of_service
            else ("none" if v.ignore else ("restart" if v.application else "none"))
        )
        text = f"Xid {xid} {v.mnemonic or '(unknown)'}: {v.recommended_action or 'no recommended action'}"
        return FaultVerdict(
            impact,
            v.out_of_service,
            v.escalates,
            v.needs_human,
            v.remediation,
            v.recommended_action,
            v.ignore,
            text,
        )
    if kind == "ecc_uncorrectable":
        return FaultVerdict(
            "device",
            True,
            True,
            False,
            "gpu_reset",
            "RESET_GPU",
            explanation="uncorrectable ECC: the GPU leaves service",
        )
    if kind == "nvlink_error":
        return FaultVerdict(
            "node",
            True,
            True,
            False,
            "reboot",
            "WORKFLOW_NVLINK_ERR",
            explanation="NVLink error: the node's GPUs cannot be trusted together",
        )
    if kind == "node_unreachable":
        return FaultVerdict("node", True, True, True, "reboot", explanation="node unreachable")
    if kind in ("nic_down", "link_flap", "link_degraded"):
        verdict = classify_nic(details, kind=kind)
        impact = {"fatal": "nic", "degraded": "degraded", "ok": "none"}[verdict]
        return FaultVerdict(impact, False, verdict != "ok", False, "", explanation=f"NIC {verdict}")
    if kind == "software_crash":
        return FaultVerdict("restart", False, False, False, "", explanation="the application crashed")
    if kind == "hang":
        # Priced like a crash of the job's own code: the hardware is not suspected, the job restarts.
        return FaultVerdict(
            "restart", False, False, False, "", explanation="the job stopped making progress (hang)"
        )
    if kind in ("predicted_failure", "facility"):
        return FaultVerdict(
            "risk", False, True, False, "", explanation=f"{kind.replace('_', ' ')}: move work off early"
        )
    if kind == "drain":
        # Planned, not failed: the node leaves service whole, so its jobs are priced and moved as off a lost node,
        # but nothing is marked broken and the node does not climb the ladder.
        return FaultVerdict("node", False, False, False, "", explanation="drain: its jobs move off the node")
    if kind in ("thermal", "straggler"):
        return FaultVerdict("none", False, True, False, "", explanation=f"{kind}: counts toward escalation")
    return FaultVerdict("none", False, True, True, "", explanation=f"unknown kind {kind}")


# NIC thresholds (InfiniBand port counters). The symbol-error rate that means a degraded link is the setting
# TELEMETRY_SYMBOL_ERRORS_PER_HOUR, read by ingest (which reports the crossing) and by triage alike.
LINK_RECOVERIES_DEGRADED = 2  # link error recoveries within one reading: the link keeps retraining
DOWNTIME_FATAL_SECONDS = 30.0  # cumulative time down that outweighs the flap count
FLAPS_DEGRADED = 3


def _number(value, kind):
    if value is None or isinstance(value, bool):
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class NicFaultDetails:
    """The one definition of what a NIC fault's ``details`` say about its link: telemetry ingest writes it from
    the port counters (``as_details``), any reporter may send the same keys through the API, and triage reads it
    (``of``). A field that is absent is unknown. Counts are within the reading that raised the fault (deltas);
    ``downtime_seconds`` is the link's cumulative time observed down; ``symbol_rate_per_hour`` is the smoothed
    rate of symbol errors."""

    link_state: str | None = None  # "up" or "down" at the reading
    link_downed: int | None = None  # link-down events since the previous reading
    downtime_seconds: float | None = None
    symbol_rate_per_hour: float | None = None
    link_error_recoveries: int | None = None  # link error recoveries since the previous reading
    flaps: int | None = None

    KEYS = (
        "link_state",
        "link_downed",
        "downtime_seconds",
        "symbol_rate_per_hour",
        "link_error_recoveries",
        "flaps",
    )

    @classmethod
    def of(cls, details: dict | None) -> "NicFaultDetails":
        details = details if isinstance(details, dict) else {}
        state = details.get("link_state")
        return cls(
            link_state=state if state in ("up", "down") else None,
            link_downed=_number(details.get("link_downed"), int),
            downtime_seconds=_number(details.get("downtime_seconds"), float),
            symbol_rate_per_hour=_number(details.get("symbol_rate_per_hour"), float),
            link_error_recoveries=_number(details.get("link_error_recoveries"), int),
            flaps=_number(details.get("flaps"), int),
        )

    def as_details(self) -> dict:
        return {key: getattr(self, key) for key in self.KEYS if getattr(self, key) is not None}

    @property
    def has_counters(self) -> bool:
        return any(getattr(self, key) is not None for key in self.KEYS)


def classify_nic(details: dict | NicFaultDetails, *, kind: str = "") -> str:
    """'fatal', 'degraded' or 'ok' for a NIC, from its fault's details (``NicFaultDetails``).

    The link down, or any link-down event, is fatal; so is long cumulative downtime, which weighs more than the
    number of flaps. A symbol-error rate above ``TELEMETRY_SYMBOL_ERRORS_PER_HOUR``, repeated link error
    recoveries within a reading, or many flaps mean degraded. Without counters the reported kind decides:
    nic_down is fatal, link_flap and link_degraded degrade.
    """
    nic = details if isinstance(details, NicFaultDetails) else NicFaultDetails.of(details)
    if nic.link_state == "down" or (nic.link_downed or 0) > 0:
        return "fatal"
    if (nic.downtime_seconds or 0) >= DOWNTIME_FATAL_SECONDS:
        return "fatal"
    if (nic.symbol_rate_per_hour or 0) > settings.TELEMETRY_SYMBOL_ERRORS_PER_HOUR:
        return "degraded"
    if (nic.link_error_recoveries or 0) >= LINK_RECOVERIES_DEGRADED:
        return "degraded"
    if (nic.flaps or 0) >= FLAPS_DEGRADED:
        return "degraded"
    if nic.has_counters:
        return "ok"
    return {"nic_down": "fatal", "link_flap": "degraded", "link_degraded": "degraded"}.get(kind, "ok")
