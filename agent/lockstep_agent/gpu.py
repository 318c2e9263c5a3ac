"""GPU readings and Xid events through NVML (the nvidia-ml-py package, imported as ``pynvml``).

Field names follow dcgm-exporter's (``DCGM_FI_DEV_*``); units are converted to base units where NVML's
differ (milliwatts -> watts, bytes stay bytes). docs/ingest-schema.md lists every field and its unit.
A field the GPU or driver does not support is left out of the reading, never sent as zero.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

# NVML's nvmlDeviceGpuRecoveryAction_t, by value.
RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}

# (NVML field id constant, dcgm-exporter field name) read in one nvmlDeviceGetFieldValues call.
_FIELD_VALUES = (
    ("NVML_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"),
    ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    # Older drivers lack this field (and nvmlDeviceGetGpuRecoveryAction); then it is simply absent.
    ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"),
)

# Per-link counters summed when the *_TOTAL field values are not supported.
_NVLINK_COUNTERS = (
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_REPLAY", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
)


class GPUUnavailable(Exception):
    """NVML could not be loaded or initialised, or it sees no GPU; the message says which."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status  # "no_nvml" or "no_gpus"
        self.reason = reason


def load_nvml() -> ModuleType:
    """Import pynvml. Tests put a fake module in sys.modules["pynvml"] to replace NVML at this boundary."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as error:
        raise GPUUnavailable("no_nvml", f"the pynvml module is not installed ({error})") from error


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str
    last_xid: int | None = None


@dataclass
class GPUCollector:
    """Opens NVML once, then yields one reading per GPU per call to collect() and the Xid events since."""

    nvml: ModuleType | None = None
    devices: list[_Device] = field(default_factory=list)
    driver_version: str | None = None
    event_set: Any = None
    pending_events: list[dict] = field(default_factory=list)

    def open(self) -> None:
        """Initialise NVML and register for Xid events; raises GPUUnavailable with a reason."""
        nvml = self.nvml or load_nvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            raise GPUUnavailable("no_nvml", f"NVML could not be initialised: {error}") from error
        except OSError as error:  # a broken libnvidia-ml.so
            raise GPUUnavailable("no_nvml", f"NVML could not be loaded: {error}") from error
        self.nvml = nvml
        try:
            self.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            self.driver_version = None
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise GPUUnavailable("no_nvml", f"NVML cannot count the GPUs: {error}") from error
        self.devices = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid, model = _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
            except nvml.NVMLError as error:
                # A GPU that has fallen off the bus cannot be named; the others are still worth reading,
                # and the server sees the missing index.
                log.error("GPU %d cannot be opened through NVML (%s); reporting the others", index, error)
                continue
            self.devices.append(_Device(index=index, handle=handle, uuid=uuid, model=model))
        if not self.devices:
            raise GPUUnavailable(
                "no_gpus", "NVML is loaded but sees no GPU" if count == 0 else "NVML cannot open any GPU"
            )
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nvml = self.nvml
        try:
            self.event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            log.warning("NVML event sets are not available (%s); Xid events will not be reported", error)
            self.event_set = None
            return
        for device in self.devices:
            try:
                nvml.nvmlDeviceRegisterEvents(
                    device.handle, nvml.nvmlEventTypeXidCriticalError, self.event_set
                )
            except nvml.NVMLError as error:
                log.warning("GPU %d does not report Xid events through NVML: %s", device.index, error)

    def close(self) -> None:
        if self.nvml is None:
            return
        try:
            if self.event_set is not None:
                self.nvml.nvmlEventSetFree(self.event_set)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    # --- Xid events ----------------------------------------------------------------------------------------

    def wait_for_events(self, seconds: float) -> None:
        """Spend up to `seconds` waiting on the NVML event set, keeping each Xid with the time it arrived.

        The agent waits here between collections instead of sleeping, so an Xid is timestamped when NVML
        delivers it rather than at the next collection.
        """
        deadline = time.monotonic() + seconds
        if self.event_set is None:
            time.sleep(max(0.0, seconds))
            return
        nvml = self.nvml
        while True:
            # 0 still polls once, so events already queued are drained without blocking.
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                data = nvml.nvmlEventSetWait(self.event_set, remaining_ms)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    # Never return early, or the caller's wait loop would spin.
                    time.sleep(max(0.0, deadline - time.monotonic()))
                    return
                log.warning("waiting for NVML events failed: %s", error)
                time.sleep(max(0.0, deadline - time.monotonic()))
                return
            self._record_event(data)

    def _record_event(self, data: Any) -> None:
        if not data.eventType & self.nvml.nvmlEventTypeXidCriticalError:
            return
        device = self._device_for(data.device)
        xid = int(data.eventData)
        event = {"ts": time.time(), "type": "xid", "xid": xid}
        if device is not None:
            device.last_xid = xid
            event.update(gpu=device.index, uuid=device.uuid)
        self.pending_events.append(event)

    def _device_for(self, handle: Any) -> _Device | None:
        try:
            uuid = _text(self.nvml.nvmlDeviceGetUUID(handle))
        except self.nvml.NVMLError:
            return None
        return next((device for device in self.devices if device.uuid == uuid), None)

    def take_events(self) -> list[dict]:
        self.wait_for_events(0)
        events, self.pending_events = self.pending_events, []
        return events

    # --- readings ------------------------------------------------------------------------------------------

    def collect(self) -> list[dict]:
        """One reading per GPU: {"ts", "gpu", "uuid", "model", "fields": {DCGM name: number}}."""
        readings = []
        for device in self.devices:
            reading = {"ts": time.time(), "gpu": device.index, "uuid": device.uuid, "model": device.model}
            reading["fields"] = fields = self._fields(device)
            action = fields.get("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION")
            if action is not None:
                reading["recovery_action"] = recovery_action_name(action)
            readings.append(reading)
        return readings

    def _fields(self, device: _Device) -> dict[str, float | int]:
        nvml, handle = self.nvml, device.handle
        fields: dict[str, float | int] = {}

        def read(name: str, getter, *args, convert=lambda value: value):
            try:
                fields[name] = convert(getter(*args))
            except nvml.NVMLError as error:
                log.debug("GPU %d: %s not available: %s", device.index, name, error)

        read("DCGM_FI_DEV_GPU_TEMP", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        read("DCGM_FI_DEV_POWER_USAGE", nvml.nvmlDeviceGetPowerUsage, handle, convert=lambda mw: mw / 1000.0)
        try:
            utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            fields["DCGM_FI_DEV_GPU_UTIL"] = utilization.gpu
            fields["DCGM_FI_DEV_MEM_COPY_UTIL"] = utilization.memory
        except nvml.NVMLError as error:
            log.debug("GPU %d: utilisation not available: %s", device.index, error)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            fields["DCGM_FI_DEV_FB_USED"] = int(memory.used)
            fields["DCGM_FI_DEV_FB_FREE"] = int(memory.free)
            fields["DCGM_FI_DEV_FB_TOTAL"] = int(memory.total)
        except nvml.NVMLError as error:
            log.debug("GPU %d: memory not available: %s", device.index, error)

        corrected, uncorrected = (
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        )
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        read("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nvml.nvmlDeviceGetTotalEccErrors, handle, corrected, volatile)
        read("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, volatile)
        read("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", nvml.nvmlDeviceGetTotalEccErrors, handle, corrected, aggregate)
        read(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", nvml.nvmlDeviceGetTotalEccErrors, handle, uncorrected, aggregate
        )

        # Page retirement (pre-Ampere); Ampere and later remap rows instead and report NOT_SUPPORTED here.
        read(
            "DCGM_FI_DEV_RETIRED_SBE",
            nvml.nvmlDeviceGetRetiredPages,
            handle,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            convert=len,
        )
        read(
            "DCGM_FI_DEV_RETIRED_DBE",
            nvml.nvmlDeviceGetRetiredPages,
            handle,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            convert=len,
        )
        read("DCGM_FI_DEV_RETIRED_PENDING", nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle, convert=int)
        try:
            correctable, uncorrectable, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
            fields["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = int(correctable)
            fields["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = int(uncorrectable)
            fields["DCGM_FI_DEV_ROW_REMAP_PENDING"] = int(bool(pending))
            fields["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = int(bool(failure))
        except nvml.NVMLError as error:
            log.debug("GPU %d: remapped rows not available: %s", device.index, error)

        reasons = (
            getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        read("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", reasons, handle, convert=int)

        fields.update(self._field_values(device))
        if not any(name in fields for _, name in _NVLINK_COUNTERS):
            fields.update(self._nvlink_per_link(device))

        # dcgm-exporter's DCGM_FI_DEV_XID_ERRORS is the value of the last Xid seen; 0 while there has been none.
        self.wait_for_events(0)
        fields["DCGM_FI_DEV_XID_ERRORS"] = device.last_xid or 0
        return fields

    def _field_values(self, device: _Device) -> dict[str, float | int]:
        nvml = self.nvml
        wanted = [
            (getattr(nvml, constant), name) for constant, name in _FIELD_VALUES if hasattr(nvml, constant)
        ]
        if not wanted or not hasattr(nvml, "nvmlDeviceGetFieldValues"):
            return {}
        try:
            values = nvml.nvmlDeviceGetFieldValues(device.handle, [field_id for field_id, _ in wanted])
        except nvml.NVMLError as error:
            log.debug("GPU %d: field values not available: %s", device.index, error)
            return {}
        result: dict[str, float | int] = {}
        for (_, name), value in zip(wanted, values, strict=False):
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                continue
            result[name] = _field_value(nvml, value)
        return result

    def _nvlink_per_link(self, device: _Device) -> dict[str, int]:
        nvml = self.nvml
        totals: dict[str, int] = {}
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(device.handle, link):
                    continue
            except nvml.NVMLError:
                continue  # no such link, or NVLink not supported at all
            for constant, name in _NVLINK_COUNTERS:
                try:
                    count = nvml.nvmlDeviceGetNvLinkErrorCounter(device.handle, link, getattr(nvml, constant))
                except nvml.NVMLError:
                    continue
                totals[name] = totals.get(name, 0) + int(count)
        return totals


def _field_value(nvml: ModuleType, value: Any) -> float | int:
    kind = value.valueType
    if kind == nvml.NVML_VALUE_TYPE_DOUBLE:
        return float(value.value.dVal)
    attribute = {
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
    }.get(kind, "ullVal")
    return int(getattr(value.value, attribute))


def recovery_action_name(value: int | None) -> str | None:
    """NVML's recommended recovery action as a word (docs/ingest-schema.md), or None when not reported."""
    if value is None:
        return None
    return RECOVERY_ACTIONS.get(int(value), f"UNKNOWN_{int(value)}")
