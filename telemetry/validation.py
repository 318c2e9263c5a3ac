"""Validate a telemetry batch at once against the agent's published JSON Schema (compiled, not per-field DRF).

The schema file is the one the agent ships (agent/lockstep_agent/schema/telemetry-batch.schema.json), read
as data: agent/ stays a package of its own that imports nothing of the project, and the two cannot drift.
"""

import functools
import json
from pathlib import Path

import fastjsonschema
import orjson
from django.conf import settings

from controlplane.errors import ServiceError

SCHEMA_PATH = Path(settings.BASE_DIR) / "agent" / "lockstep_agent" / "schema" / "telemetry-batch.schema.json"


@functools.cache
def _validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    # fastjsonschema compiles drafts 4–7; the schema uses nothing of 2020-12 beyond "$defs" references.
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return fastjsonschema.compile(schema)


def _field_name(path: str) -> str:
    name = path.removeprefix("data").lstrip(".")
    return name or "body"


def parse_batch(body: bytes) -> dict:
    """The batch as a dict, or ServiceError(400) naming the field at fault."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ServiceError(f"the body is not valid JSON: {error}") from error
    try:
        _validator()(payload)
    except fastjsonschema.JsonSchemaValueException as error:
        raise ServiceError(
            error.message.removeprefix("data").lstrip(". "), field=_field_name(error.name)
        ) from error
    return payload
