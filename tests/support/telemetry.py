"""Telemetry batches in the shape the node agent posts them (GPU readings, NIC states, events), for the tests that
ingest them."""

import time
import uuid


def reading(gpu: int, ts: float | None = None, node: str | None = None, **fields) -> dict:
    base = {
        "DCGM_FI_DEV_GPU_TEMP": 55.0,
        "DCGM_FI_DEV_POWER_USAGE": 400.0,
        "DCGM_FI_DEV_GPU_UTIL": 90.0,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0,
    }
    base.update(fields)
    item = {"ts": ts or time.time(), "gpu": gpu, "uuid": f"GPU-{gpu}", "fields": base}
    if node:
        item["node"] = node
    return item


def nic(
    name: str, ts: float | None = None, link_state: str = "up", node: str | None = None, **fields
) -> dict:
    base = {"link_downed": 0, "symbol_error": 0, "link_error_recovery": 0, "port_rcv_errors": 0}
    base.update(fields)
    item = {
        "ts": ts or time.time(),
        "name": name,
        "kind": "infiniband",
        "link_state": link_state,
        "fields": base,
    }
    if node:
        item["node"] = node
    return item


def batch(
    node: str | None, readings=(), nics=(), events=(), facility=(), batch_id: str | None = None, sent_at=None
) -> dict:
    now = time.time()
    return {
        "schema_version": 1,
        "batch_id": batch_id or str(uuid.uuid4()),
        "agent": {
            "name": "lockstep-agent",
            "version": "test",
            "hostname": node or "relay",
            "gpu_status": "ok",
        },
        "created_at": now,
        "sent_at": sent_at or now,
        "node": node,
        "readings": list(readings),
        "nics": list(nics),
        "events": list(events),
        "facility": list(facility),
    }
