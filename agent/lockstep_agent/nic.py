"""NIC readings from sysfs: /sys/class/net (every physical interface) and /sys/class/infiniband (HCA ports).

An InfiniBand or RoCE port whose netdev is known (``<ibdev>/device/net/<netdev>``) is reported once, under
the netdev's name, with both sets of counters; a port without a netdev is reported as ``<ibdev>:<port>``.
The sysfs root is injectable so tests can build a tree in a temporary directory.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

# /sys/class/net/<if>/ counters, sent under these names.
_NET_COUNTERS = {
    "carrier_changes": "carrier_changes",
    "carrier_up_count": "carrier_up_count",
    "carrier_down_count": "carrier_down_count",
    "statistics/rx_errors": "rx_errors",
    "statistics/tx_errors": "tx_errors",
    "statistics/rx_crc_errors": "rx_crc_errors",
    "statistics/rx_dropped": "rx_dropped",
    "statistics/tx_dropped": "tx_dropped",
    "statistics/rx_bytes": "rx_bytes",
    "statistics/tx_bytes": "tx_bytes",
}

# /sys/class/infiniband/<dev>/ports/<n>/counters/<name>, sent under the same names.
_IB_COUNTERS = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)


def _read(path: Path) -> str | None:
    """The stripped contents of a sysfs file, or None where it is missing or unreadable.

    Some attributes (carrier, speed) fail with EINVAL while a link is administratively down.
    """
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _ib_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'."""
    if text is None:
        return None
    return text.split(":", 1)[-1].strip() or None


def _ib_rate_bps(text: str | None) -> int | None:
    """'400 Gb/sec (4X NDR)' -> 400_000_000_000."""
    if not text:
        return None
    match = re.match(r"\s*([\d.]+)\s*Gb/sec", text)
    return int(float(match.group(1)) * 1_000_000_000) if match else None


class NICCollector:
    """Reads NIC state and error counters; collect() returns one entry per NIC."""

    def __init__(self, sysfs_root: str | os.PathLike = "/sys", include_virtual: bool = False):
        self.root = Path(sysfs_root)
        self.include_virtual = include_virtual

    def collect(self) -> list[dict]:
        now = time.time()
        nics: dict[str, dict] = {}
        net_dir = self.root / "class" / "net"
        for interface in sorted(net_dir.iterdir()) if net_dir.is_dir() else []:
            # Virtual interfaces (lo, bridges, veth, docker0) have no device link; they are not NICs.
            if not self.include_virtual and not (interface / "device").exists():
                continue
            nics[interface.name] = self._net(interface, now)

        ib_dir = self.root / "class" / "infiniband"
        for device in sorted(ib_dir.iterdir()) if ib_dir.is_dir() else []:
            netdevs = sorted(p.name for p in (device / "device" / "net").glob("*"))
            ports_dir = device / "ports"
            ports = (
                sorted(ports_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0)
                if ports_dir.is_dir()
                else []
            )
            for port in ports:
                # A multi-port HCA function usually has one netdev per port; match them in order.
                position = ports.index(port)
                netdev = netdevs[position] if position < len(netdevs) else None
                entry = nics.get(netdev) if netdev else None
                if entry is None:
                    entry = {
                        "ts": now,
                        "name": netdev or f"{device.name}:{port.name}",
                        "kind": "infiniband",
                        "fields": {},
                    }
                    if netdev:
                        entry["netdev"] = netdev
                    nics[entry["name"]] = entry
                self._ib_port(entry, device.name, port)
        return [nics[name] for name in sorted(nics)]

    def _net(self, interface: Path, now: float) -> dict:
        operstate = _read(interface / "operstate")
        carrier = _read_int(interface / "carrier")
        link_type = _read_int(interface / "type")
        entry: dict = {
            "ts": now,
            "name": interface.name,
            # ARPHRD_INFINIBAND is 32: an IPoIB interface.
            "kind": "infiniband" if link_type == 32 else "ethernet",
            "netdev": interface.name,
            "link_state": _link_state(operstate, carrier),
            "fields": {},
        }
        if operstate is not None:
            entry["operstate"] = operstate
        if carrier is not None:
            entry["fields"]["carrier"] = carrier
        speed = _read_int(interface / "speed")
        if speed is not None and speed > 0:
            entry["speed_bps"] = speed * 1_000_000  # sysfs gives Mb/s
        for relative, name in _NET_COUNTERS.items():
            value = _read_int(interface / relative)
            if value is not None:
                entry["fields"][name] = value
        return entry

    def _ib_port(self, entry: dict, device: str, port: Path) -> None:
        entry["ib_device"] = device
        entry["ib_port"] = int(port.name) if port.name.isdigit() else port.name
        state = _ib_state(_read(port / "state"))
        physical = _ib_state(_read(port / "phys_state"))
        if state:
            entry["ib_state"] = state
        if physical:
            entry["ib_phys_state"] = physical
        layer = _read(port / "link_layer")
        if layer == "Ethernet":
            entry["kind"] = "roce"
        elif layer == "InfiniBand":
            entry["kind"] = "infiniband"
        rate = _ib_rate_bps(_read(port / "rate"))
        if rate:
            entry.setdefault("speed_bps", rate)
        for name in _IB_COUNTERS:
            value = _read_int(port / "counters" / name)
            if value is not None:
                entry["fields"][name] = value
        # The port's state is the truth for the fabric; an IPoIB netdev can say "up" over a port in INIT.
        if state is not None:
            entry["link_state"] = "up" if state == "ACTIVE" and physical in (None, "LinkUp") else "down"
        entry.setdefault("link_state", "unknown")


def _link_state(operstate: str | None, carrier: int | None) -> str:
    if operstate == "up" or (operstate in (None, "unknown") and carrier == 1):
        return "up"
    if operstate in ("down", "lowerlayerdown", "notpresent", "dormant") or carrier == 0:
        return "down"
    return "unknown"
