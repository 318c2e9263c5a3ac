"""The agent's local /metrics: dcgm-exporter's metric names and labels, the last Xid at once, and the command's
--metrics-port. NVML is the fake module at the import boundary (tests/agent/fakenvml)."""

import json
import os
import subprocess
import sys
import time

import pytest
import requests
from lockstep_agent.gpu import GPUCollector
from lockstep_agent.metrics import DCGMCollector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.agent import FAKE_NVML_DIR, free_port, load_fake_nvml

LABELS = {"gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def scrape(collector) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}, text


@pytest.fixture
def nvml():
    module = load_fake_nvml()
    module.configure(
        gpus=[
            {},
            {
                "temperature": 93,
                "ecc": {
                    "corrected_volatile": 0,
                    "uncorrected_volatile": 2,
                    "corrected_aggregate": 0,
                    "uncorrected_aggregate": 2,
                },
            },
        ]
    )
    return module


def test_readings_are_served_under_dcgm_exporter_names_and_labels(nvml):
    gpus = GPUCollector(nvml=nvml)
    gpus.open()
    exported = DCGMCollector(hostname="gpu-node-7", gpus=gpus)
    exported.update(gpus.collect())
    families, text = scrape(exported)

    temps = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_TEMP"]}
    assert temps["0"].value == 41 and temps["1"].value == 93
    assert set(temps["1"].labels) == LABELS
    assert temps["1"].labels["UUID"] == gpus.devices[1].uuid and temps["1"].labels["device"] == "nvidia1"
    assert (
        temps["1"].labels["modelName"] == "NVIDIA H100 80GB HBM3"
        and temps["1"].labels["Hostname"] == "gpu-node-7"
    )
    assert temps["1"].labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    assert "# TYPE DCGM_FI_DEV_XID_ERRORS gauge" in text and "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in text
    # Counters keep dcgm-exporter's names exactly (no _total appended), so the shipped rules read them.
    dbe = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]}
    assert dbe == {"0": 0, "1": 2}
    assert {s.name for s in families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]} == {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total" not in text
    remapped = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"]}
    assert remapped == {"0": 2, "1": 2}
    assert {s.value for s in families["DCGM_FI_DEV_POWER_USAGE"]} == {312.5}  # watts, as dcgm-exporter
    gpus.close()


def test_the_last_xid_shows_on_the_next_scrape_before_the_next_collection(nvml):
    gpus = GPUCollector(nvml=nvml)
    gpus.open()
    exported = DCGMCollector(hostname="n1", gpus=gpus)
    exported.update(gpus.collect())
    families, _ = scrape(exported)
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]} == {"0": 0, "1": 0}

    nvml.inject_xid(1, 79)
    gpus.wait_for_events(0)  # the agent's loop waits on NVML's event set between collections
    families, _ = scrape(exported)
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]} == {"0": 0, "1": 79}
    nvml.inject_xid(1, 48)  # a later Xid replaces the code, as dcgm-exporter's gauge does
    gpus.wait_for_events(0)
    families, _ = scrape(exported)
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]} == {"0": 0, "1": 48}
    gpus.close()


def test_before_the_first_collection_only_the_xid_gauge_is_served(nvml):
    gpus = GPUCollector(nvml=nvml)
    gpus.open()
    families, _ = scrape(DCGMCollector(hostname="n1", gpus=gpus))
    assert set(families) == {"DCGM_FI_DEV_XID_ERRORS"} and len(families["DCGM_FI_DEV_XID_ERRORS"]) == 2
    families, _ = scrape(DCGMCollector(hostname="n1", gpus=None))  # no GPU: nothing, and no error
    assert families == {}
    gpus.close()


def test_the_agent_command_serves_metrics_on_its_port(tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOCKSTEP_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), env.get("PYTHONPATH", "")]),
        FAKE_NVML_CONFIG=json.dumps({"xids": [[0, 31]]}),
    )
    (tmp_path / "sys").mkdir()
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockstep_agent",
            "--dry-run",
            "--node",
            "gpu-node-9",
            "--interval",
            "0.5",
            "--sysfs-root",
            str(tmp_path / "sys"),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline and "DCGM_FI_DEV_GPU_TEMP" not in text:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
            except requests.RequestException:
                time.sleep(0.2)
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        xids = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]}
        assert xids == {"0": 31, "1": 0}
        assert {s.labels["Hostname"] for s in families["DCGM_FI_DEV_GPU_TEMP"]} == {"gpu-node-9"}
    finally:
        agent.terminate()
        _, errors = agent.communicate(timeout=10)
    assert agent.returncode == 0, errors


def test_a_port_in_use_is_a_clear_usage_error(tmp_path):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {key: value for key, value in os.environ.items() if not key.startswith("LOCKSTEP_")}
        env.update(PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), env.get("PYTHONPATH", "")]))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "lockstep_agent",
                "--dry-run",
                "--once",
                "--metrics-port",
                str(port),
                "--metrics-address",
                "127.0.0.1",
                "--sysfs-root",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    assert done.returncode == 64 and f"cannot serve /metrics on 127.0.0.1:{port}" in done.stderr
