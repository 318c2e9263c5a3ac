"""The agent's optional local /metrics: what it collects, under dcgm-exporter's metric names and labels.

A cluster without dcgm-exporter gets the same Prometheus alerts (deploy/prometheus/rules/gpu.rules.yml) from the
agent, and one with it gets the same names. Each GPU's series carry dcgm-exporter's labels: ``gpu`` (index),
``UUID``, ``device`` (``nvidia<index>``), ``modelName``, ``Hostname`` (the node's name in Lockstep) and
``DCGM_FI_DRIVER_VERSION``.

Readings are those of the last collection; ``DCGM_FI_DEV_XID_ERRORS`` (the last Xid code, 0 while there has been
none) is read from the collector at scrape time, so an Xid shows on the next scrape, not the next interval.
dcgm-exporter declares its ECC, NVLink, retired-page and remapped-row fields as counters; they are served here
untyped under the same names, since prometheus_client would append ``_total`` to a counter's name. PromQL's
rate() and increase() do not look at the type.

Needs prometheus_client (``pip install lockstep-agent[metrics]``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from lockstep_agent.gpu import GPUCollector

# dcgm-exporter's counters (etc/default-counters.csv); every other field is a gauge.
COUNTERS = frozenset(
    {
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    }
)
HELP = {
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in bytes).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in bytes).",
    "DCGM_FI_DEV_FB_TOTAL": "Framebuffer memory total (in bytes).",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "Total number of double-bit volatile ECC errors.",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "Total number of single-bit volatile ECC errors.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for uncorrectable errors",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for correctable errors",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "Whether remapping of rows is pending",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "Current clock throttle reasons (bitmask).",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "Total number of NVLink recovery errors.",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "Total number of NVLink flow-control CRC errors.",
}
LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]


class DCGMCollector:
    """A prometheus_client collector of the agent's latest GPU readings under dcgm-exporter's names."""

    def __init__(self, *, hostname: str, gpus: GPUCollector | None):
        self.hostname = hostname
        self.gpus = gpus
        self._readings: list[dict] = []
        self._lock = threading.Lock()

    def update(self, readings: list[dict]) -> None:
        """Called by the agent's loop after each collection."""
        with self._lock:
            self._readings = list(readings)

    def _last_xids(self) -> dict[int, int]:
        devices = self.gpus.devices if self.gpus is not None else []
        return {device.index: device.last_xid or 0 for device in devices}

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily, Metric

        with self._lock:
            readings = list(self._readings)
        driver = (self.gpus.driver_version if self.gpus is not None else None) or ""
        families: dict[str, Metric] = {}

        def family(name: str) -> Metric:
            if name not in families:
                documentation = HELP.get(name, name)
                if name in COUNTERS:
                    families[name] = Metric(name, documentation, "unknown")
                else:
                    families[name] = GaugeMetricFamily(name, documentation, labels=LABELS)
            return families[name]

        xids = self._last_xids()
        seen = set()
        for reading in readings:
            index = reading["gpu"]
            labels = [
                str(index),
                reading.get("uuid", ""),
                f"nvidia{index}",
                reading.get("model", ""),
                self.hostname,
                driver,
            ]
            fields = dict(reading.get("fields", {}))
            if index in xids:
                fields["DCGM_FI_DEV_XID_ERRORS"] = xids[index]
            seen.add(index)
            for name, value in sorted(fields.items()):
                metric = family(name)
                if isinstance(metric, GaugeMetricFamily):
                    metric.add_metric(labels, float(value))
                else:
                    metric.add_sample(name, dict(zip(LABELS, labels, strict=True)), float(value))
        # A GPU not yet collected still has its Xid gauge (the agent opened it; it may have raised one already).
        for device in self.gpus.devices if self.gpus is not None else []:
            if device.index not in seen:
                labels = [
                    str(device.index),
                    device.uuid,
                    f"nvidia{device.index}",
                    device.model,
                    self.hostname,
                    driver,
                ]
                family("DCGM_FI_DEV_XID_ERRORS").add_metric(labels, float(device.last_xid or 0))
        yield from families.values()


def serve(collector: DCGMCollector, *, port: int, address: str = "0.0.0.0"):
    """Serve ``collector`` at http://address:port/metrics from a daemon thread; returns (server, thread)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return start_http_server(port, addr=address, registry=registry)
