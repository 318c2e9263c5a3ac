"""The telemetry batch the agent sends (docs/ingest-schema.md; schema/telemetry-batch.schema.json)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from importlib import resources

from lockstep_agent import __version__

SCHEMA_VERSION = 1
SCHEMA_RESOURCE = "schema/telemetry-batch.schema.json"


def load_schema() -> dict:
    """The batch's JSON Schema, as shipped in this package (the server reads the same file)."""
    return json.loads(resources.files("lockstep_agent").joinpath(SCHEMA_RESOURCE).read_text())


def make_batch(
    *,
    node: str | None,
    gpu_status: str,
    gpu_status_reason: str | None = None,
    driver_version: str | None = None,
    readings: list[dict] | None = None,
    nics: list[dict] | None = None,
    events: list[dict] | None = None,
    facility: list[dict] | None = None,
) -> dict:
    """A new batch with a fresh batch_id; `sent_at` is set again by the sender at every attempt."""
    now = time.time()
    agent = {
        "name": "lockstep-agent",
        "version": __version__,
        "hostname": socket.gethostname(),
        "gpu_status": gpu_status,
    }
    if gpu_status_reason:
        agent["gpu_status_reason"] = gpu_status_reason[:500]
    if driver_version is not None:
        agent["driver_version"] = driver_version
    return {
        "schema_version": SCHEMA_VERSION,
        "batch_id": str(uuid.uuid4()),
        "agent": agent,
        "created_at": now,
        "sent_at": now,
        "node": node,
        "readings": readings or [],
        "nics": nics or [],
        "events": events or [],
        "facility": facility or [],
    }
