"""Lockstep node agent: reads GPU, NIC and facility telemetry and sends it to the control plane over HTTP.

It imports nothing of the Lockstep project; the batch it sends is described in docs/ingest-schema.md and
by the JSON Schema in lockstep_agent/schema/telemetry-batch.schema.json.
"""

__version__ = "0.1.0"
