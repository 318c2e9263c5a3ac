"""A fake ``pynvml`` for the agent's tests: there is no GPU on the machines these tests run on.

It stands in for nvidia-ml-py at the import boundary: tests put it in sys.modules["pynvml"], or put this
directory first on PYTHONPATH for a subprocess. It holds the subset of the real module's API that the
agent calls, with the same names, constants and error behaviour (NVMLError with .value; NOT_SUPPORTED for
what a GPU lacks; TIMEOUT from nvmlEventSetWait when nothing arrived).

State comes from configure(...) in-process, or from the JSON in $FAKE_NVML_CONFIG at import.
"""

from __future__ import annotations

import collections
import json
import os
import time
import types

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3

NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6

NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


# A healthy H100 as NVML reports it (power in mW, memory in bytes).
DEFAULT_GPU = {
    "name": "NVIDIA H100 80GB HBM3",
    "temperature": 41,
    "memory_temperature": 38,
    "power_mw": 312500,
    "utilization": [87, 35],
    "memory": {"total": 85520809984, "used": 61203283968},
    "ecc": {
        "corrected_volatile": 3,
        "uncorrected_volatile": 0,
        "corrected_aggregate": 17,
        "uncorrected_aggregate": 0,
    },
    "retired_pages": None,  # Ampere and later: NOT_SUPPORTED; a list [sbe_pages, dbe_pages] for older GPUs
    "remapped_rows": [2, 0, 0, 0],
    "throttle_reasons": 0x4,
    "nvlink_totals": {"crc_flit": 0, "crc_data": 0, "replay": 1, "recovery": 0},
    "nvlink_links": None,  # {link: {counter: n}} when the *_TOTAL field values are unsupported
    "pcie_replays": 0,
    "recovery_action": 0,  # None: the driver predates NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    "xid_events": True,
    "lost": False,  # fallen off the bus: NVML cannot open it
}

_state: dict = {}


def configure(
    *, fail: str | None = None, gpus: list[dict] | None = None, driver: str = "550.54.15", xids=()
) -> None:
    """Reset the fake: `fail` is None, "library_not_found" or "driver_not_loaded"; `gpus` overrides per
    GPU (merged over DEFAULT_GPU); `xids` are (gpu index, xid) events already waiting in the event set."""
    devices = []
    for index, overrides in enumerate(gpus if gpus is not None else [{}, {}]):
        gpu = json.loads(json.dumps(DEFAULT_GPU))
        gpu.update(overrides)
        gpu.setdefault("uuid", f"GPU-0000000{index}-fake-4e7b-9c1a-00000000000{index}")
        gpu["index"] = index
        devices.append(types.SimpleNamespace(**gpu))
    _state.clear()
    _state.update(
        fail=fail, devices=devices, driver=driver, initialized=False, events=collections.deque(), calls=[]
    )
    for index, xid in xids:
        inject_xid(index, xid)


def inject_xid(index: int, xid: int) -> None:
    """An Xid on GPU `index`, delivered by the next nvmlEventSetWait."""
    _state["events"].append(
        types.SimpleNamespace(
            device=_state["devices"][index],
            eventType=nvmlEventTypeXidCriticalError,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
    )


def _ready():
    if not _state["initialized"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _device(handle):
    _ready()
    return handle


# --- the API the agent uses ----------------------------------------------------------------------------------


def nvmlInit():
    _state["calls"].append("nvmlInit")
    if _state["fail"] == "library_not_found":
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if _state["fail"] == "driver_not_loaded":
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    _state["initialized"] = True


def nvmlShutdown():
    _ready()
    _state["initialized"] = False


def nvmlSystemGetDriverVersion():
    _ready()
    return _state["driver"]


def nvmlDeviceGetCount():
    _ready()
    return len(_state["devices"])


def nvmlDeviceGetHandleByIndex(index):
    _ready()
    if _state["devices"][index].lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return _state["devices"][index]


def nvmlDeviceGetUUID(handle):
    return _device(handle).uuid


def nvmlDeviceGetName(handle):
    return _device(handle).name


def nvmlDeviceGetTemperature(handle, sensor):
    assert sensor == NVML_TEMPERATURE_GPU
    return _device(handle).temperature


def nvmlDeviceGetPowerUsage(handle):
    return _device(handle).power_mw


def nvmlDeviceGetUtilizationRates(handle):
    gpu, memory = _device(handle).utilization
    return types.SimpleNamespace(gpu=gpu, memory=memory)


def nvmlDeviceGetMemoryInfo(handle):
    memory = _device(handle).memory
    return types.SimpleNamespace(
        total=memory["total"], used=memory["used"], free=memory["total"] - memory["used"]
    )


def nvmlDeviceGetTotalEccErrors(handle, error_type, counter_type):
    ecc = _device(handle).ecc
    if ecc is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    kind = "corrected" if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    scope = "volatile" if counter_type == NVML_VOLATILE_ECC else "aggregate"
    return ecc[f"{kind}_{scope}"]


def nvmlDeviceGetRetiredPages(handle, cause):
    pages = _device(handle).retired_pages
    if pages is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return list(pages[cause])


def nvmlDeviceGetRetiredPagesPendingStatus(handle):
    if _device(handle).retired_pages is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 0


def nvmlDeviceGetRemappedRows(handle):
    rows = _device(handle).remapped_rows
    if rows is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return tuple(rows)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return _device(handle).throttle_reasons


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):
    return _device(handle).throttle_reasons


def nvmlDeviceGetPcieReplayCounter(handle):
    return _device(handle).pcie_replays


_TOTAL_FIELDS = {
    NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
    NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
}


def _field_value(field_id, gpu):
    value = types.SimpleNamespace(ullVal=0, uiVal=0, dVal=0.0, sllVal=0, siVal=0, ulVal=0, usVal=0)
    result = types.SimpleNamespace(
        fieldId=field_id,
        scopeId=0,
        timestamp=0,
        latencyUsec=0,
        valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
        nvmlReturn=NVML_SUCCESS,
        value=value,
    )
    if field_id in _TOTAL_FIELDS and gpu.nvlink_totals is not None:
        value.ullVal = gpu.nvlink_totals[_TOTAL_FIELDS[field_id]]
    elif field_id == NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature is not None:
        result.valueType, value.uiVal = NVML_VALUE_TYPE_UNSIGNED_INT, gpu.memory_temperature
    elif field_id == NVML_FI_DEV_PCIE_REPLAY_COUNTER and gpu.pcie_replays is not None:
        value.ullVal = gpu.pcie_replays
    elif field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
        result.valueType, value.uiVal = NVML_VALUE_TYPE_UNSIGNED_INT, gpu.recovery_action
    else:
        result.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return result


def nvmlDeviceGetFieldValues(handle, field_ids):
    gpu = _device(handle)
    return [_field_value(field_id, gpu) for field_id in field_ids]


def nvmlDeviceGetNvLinkState(handle, link):
    links = _device(handle).nvlink_links
    if links is None or str(link) not in links:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 1


_COUNTER_NAMES = {
    NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


def nvmlDeviceGetNvLinkErrorCounter(handle, link, counter):
    return _device(handle).nvlink_links[str(link)][_COUNTER_NAMES[counter]]


def nvmlEventSetCreate():
    _ready()
    return types.SimpleNamespace(devices=[])


def nvmlDeviceRegisterEvents(handle, event_types, event_set):
    gpu = _device(handle)
    if not gpu.xid_events:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    event_set.devices.append((gpu, event_types))


def nvmlEventSetWait(event_set, timeout_ms):
    _ready()
    registered = {id(gpu) for gpu, _ in event_set.devices}
    events = _state["events"]
    while events:
        event = events.popleft()
        if id(event.device) in registered:
            return event
    time.sleep(timeout_ms / 1000.0)  # like NVML: block until the timeout when nothing arrives
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(event_set):
    event_set.devices.clear()


configure(**json.loads(os.environ.get("FAKE_NVML_CONFIG") or "{}"))
