"""Prometheus Alertmanager webhook (payload version 4) → FaultEvents.

Each alert maps to a fault kind from its ``alertname`` and labels (dcgm-exporter's metric names such as
DCGM_FI_DEV_XID_ERRORS, node-exporter and kube-state-metrics alerts); a ``lockstep_kind`` label overrides the
guess. The node comes from ``Hostname`` (dcgm-exporter), ``hostname``, ``node`` or ``instance``; the GPU from
``gpu``; the Xid code from an ``xid`` label or the ``value`` annotation. An alert is deduplicated on its
fingerprint and start time; a resolved alert closes what its firing opened.

Every field is bounded here, before anything is written: text and label counts capped, the Xid code a whole number
in range, the node, GPU and NIC names no longer than Lockstep stores, the fault kind one Lockstep knows. An alert out
of bounds is skipped with its reason (``problem``); the rest of its group is taken in.
"""

import math
import re
from dataclasses import dataclass
from datetime import datetime

from jobs.choices import FaultKind

# (pattern on alertname and metric-ish labels, fault kind). First match wins.
KIND_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"xid", re.I), "gpu_xid"),
    (re.compile(r"dbe|uncorrect|ecc|remap", re.I), "ecc_uncorrectable"),
    (re.compile(r"nvlink", re.I), "nvlink_error"),
    (re.compile(r"temp|thermal|throttl", re.I), "thermal"),
    (re.compile(r"symbol|linkdegrad|link_degrad|linkerror", re.I), "link_degraded"),
    (re.compile(r"flap", re.I), "link_flap"),
    (re.compile(r"nic|infiniband|linkdown|link_down|network.*down|carrier", re.I), "nic_down"),
    (
        re.compile(r"nodedown|node_down|notready|unreachable|instancedown|^up$|targetdown", re.I),
        "node_unreachable",
    ),
    (re.compile(r"cdu|pdu|coolant|facility|power.?supply|psu", re.I), "facility"),
]
NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node", "instance")


@dataclass
class MappedAlert:
    fingerprint: str
    status: str
    starts_at: datetime | None
    ends_at: datetime | None
    kind: str | None
    hostname: str | None
    gpu_index: int | None
    nic_name: str | None
    xid: int | None
    labels: dict
    annotations: dict
    problem: str = ""


MAX_FINGERPRINT = 64  # AlertRecord.fingerprint; Alertmanager's are 16 hex digits
MAX_LABELS = 200
MAX_KEY = 256  # one label or annotation name
MAX_TEXT = 4096  # one label or annotation value
MAX_TIME = 64  # startsAt, endsAt (RFC 3339 needs about 35)
MAX_XID = 65535  # NVIDIA's Xid codes are in the hundreds; FaultEvent.xid is a positive integer
MAX_GPU_INDEX = 32767  # GPU.index, FaultEvent.gpu_index
MAX_HOSTNAME = 100  # Node.hostname
MAX_NIC_NAME = 30  # NIC.name, FaultEvent.nic_name


class BadAlert(ValueError):
    """An alert whose shape Lockstep cannot read: it is skipped with this reason, the rest of the group goes on."""


def _time(value, field: str) -> datetime | None:
    if not value or str(value).startswith("0001-01-01"):
        return None
    if not isinstance(value, str) or len(value) > MAX_TIME:
        raise BadAlert(f"{field} is not an RFC 3339 time")
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise BadAlert(f"{field} is not an RFC 3339 time") from None
    if parsed.tzinfo is None:
        raise BadAlert(f"{field} has no time zone")
    return parsed


def _number(value) -> float | None:
    """A finite number written in ``value``, or None (not a number, infinite, NaN)."""
    text = str(value).strip()[:64]
    try:
        number = float(text)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _index(value, limit: int) -> int | None:
    """A device index or name-like number: a whole number from 0 to ``limit``, or None (the fault is the node's)."""
    number = _number(value)
    return int(number) if number is not None and number.is_integer() and 0 <= number <= limit else None


def _xid(value) -> int | None:
    """The Xid code: none when the alert names no number, else a whole number from 0 to MAX_XID (or BadAlert)."""
    if value is None or value == "":
        return None
    number = _number(value)
    if number is None:
        return None
    if not number.is_integer() or not 0 <= number <= MAX_XID:
        raise BadAlert(
            f"xid {str(value).strip()[:20]!r} is not an Xid code (a whole number from 0 to {MAX_XID})"
        )
    return int(number)


def _strings(value, field: str) -> dict[str, str]:
    """Labels or annotations: an object of text (numbers become text), without NULs, within bounds."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadAlert(f"{field} must be an object")
    if len(value) > MAX_LABELS:
        raise BadAlert(f"{field} has more than {MAX_LABELS} entries")
    out = {}
    for key, item in value.items():
        if isinstance(item, dict | list):
            raise BadAlert(f"{field}.{str(key)[:50]} must be text")
        if len(key) > MAX_KEY:
            raise BadAlert(f"{field} has a name over {MAX_KEY} characters")
        text = "" if item is None else str(item)
        if "\x00" in key or "\x00" in text or len(text) > MAX_TEXT:
            raise BadAlert(
                f"{field}.{str(key)[:50].replace(chr(0), '')} holds a NUL or is over {MAX_TEXT} characters"
            )
        out[str(key)] = text
    return out


def map_alert(alert: dict) -> MappedAlert:
    """The fault an alert reports; ``problem`` says why it cannot be taken in (it is then skipped)."""
    try:
        return _map(alert)
    except BadAlert as error:
        fingerprint = str(alert.get("fingerprint") or "").replace("\x00", "")[:MAX_FINGERPRINT]
        return MappedAlert(
            fingerprint=fingerprint,
            status="",
            starts_at=None,
            ends_at=None,
            kind=None,
            hostname=None,
            gpu_index=None,
            nic_name=None,
            xid=None,
            labels={},
            annotations={},
            problem=str(error),
        )


def _map(alert: dict) -> MappedAlert:
    fingerprint = alert.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise BadAlert("alert has no fingerprint")
    if len(fingerprint) > MAX_FINGERPRINT or not fingerprint.isprintable():
        raise BadAlert(f"fingerprint must be at most {MAX_FINGERPRINT} printable characters")
    labels = _strings(alert.get("labels"), "labels")
    annotations = _strings(alert.get("annotations"), "annotations")
    subject = " ".join([labels.get("alertname", ""), labels.get("__name__", ""), labels.get("metric", "")])
    kind = labels.get("lockstep_kind")
    if kind and kind not in FaultKind.values:
        raise BadAlert(f"unknown fault kind {kind[:50]!r} in lockstep_kind")
    if not kind:
        kind = next((k for pattern, k in KIND_RULES if pattern.search(subject)), None)
    hostname = next((labels[name] for name in NODE_LABELS if labels.get(name)), None)
    if hostname and labels.get("instance") == hostname:
        hostname = hostname.rsplit(":", 1)[0]  # instance carries host:port
    if hostname and len(hostname) > MAX_HOSTNAME:
        raise BadAlert(f"the node label is over {MAX_HOSTNAME} characters")
    xid = None
    if kind == "gpu_xid":
        xid = _xid(
            labels.get("xid") or labels.get("err_code") or annotations.get("xid") or annotations.get("value")
        )
    nic_name = labels.get("device") or labels.get("interface") or None
    status = alert.get("status")
    mapped = MappedAlert(
        fingerprint=fingerprint,
        status=status if isinstance(status, str) and len(status) <= 20 else "",
        starts_at=_time(alert.get("startsAt"), "startsAt"),
        ends_at=_time(alert.get("endsAt"), "endsAt"),
        kind=kind,
        hostname=hostname,
        gpu_index=_index(labels.get("gpu"), MAX_GPU_INDEX),
        nic_name=nic_name if nic_name and len(nic_name) <= MAX_NIC_NAME else None,
        xid=xid,
        labels=labels,
        annotations=annotations,
    )
    if not mapped.fingerprint:
        mapped.problem = "alert has no fingerprint"
    elif mapped.status not in ("firing", "resolved"):
        mapped.problem = f"unknown status {mapped.status!r}"
    elif kind is None:
        mapped.problem = (
            f"no fault kind for alert {labels.get('alertname', '')!r} (set a lockstep_kind label)"
        )
    elif not hostname:
        mapped.problem = "no node label (Hostname, hostname, node or instance)"
    return mapped
