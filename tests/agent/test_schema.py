"""The batch JSON Schema: valid itself, agrees with docs/ingest-schema.md, and strict where it should be."""

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "ingest-schema.md"


@pytest.fixture(scope="module")
def example():
    (block,) = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    return json.loads(block)


def test_the_documented_example_is_valid(example, batch_validator):
    batch_validator.validate(example)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda b: b.pop("batch_id"), "batch_id"),
        (lambda b: b.update(batch_id="not-a-uuid"), "batch_id"),
        (lambda b: b.update(extra=1), "extra"),
        (lambda b: b.update(schema_version=2), "schema_version"),
        (lambda b: b["readings"][0]["fields"].update(gpu_temp=40), "gpu_temp"),
        (lambda b: b["readings"][0]["fields"].update(DCGM_FI_DEV_GPU_TEMP="hot"), "DCGM_FI_DEV_GPU_TEMP"),
        (
            lambda b: b["readings"][0]["fields"].update(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=-1),
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        ),
        (lambda b: b["readings"][0].pop("uuid"), "uuid"),
        (lambda b: b["nics"][0].update(link_state="flapping"), "link_state"),
        (lambda b: b["events"][0].update(type="ecc"), "type"),
        (lambda b: b["facility"][0].update(metric="exhaust_temperature_fahrenheit"), "metric"),
        (lambda b: b["facility"][0].update(scope="datacenter"), "scope"),
        (lambda b: b.update(sent_at="2026-11-30T05:00:00Z"), "sent_at"),
    ],
)
def test_what_the_schema_refuses(example, batch_validator, change, where):
    batch = copy.deepcopy(example)
    change(batch)
    errors = list(batch_validator.iter_errors(batch))
    assert errors
    assert any(where in (json.dumps(list(e.absolute_path)) + e.message) for e in errors)


def test_a_facility_only_batch(example, batch_validator):
    batch = copy.deepcopy(example)
    batch.update(node=None, readings=[], nics=[], events=[])
    batch_validator.validate(batch)


def test_a_relay_batch_names_each_readings_node(example, batch_validator):
    batch = copy.deepcopy(example)
    reading = batch["readings"][0]
    batch["readings"] = [dict(reading, node=f"gpu-{n:03d}", uuid=f"GPU-{n}") for n in range(100)]
    batch_validator.validate(batch)


def test_the_schema_ships_inside_the_package():
    from lockstep_agent.batch import load_schema

    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"] == {"const": 1}
