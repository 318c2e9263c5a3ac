"""The lockstep-agent command, run as a process (python -m lockstep_agent) with the fake NVML on its path."""

import json

import pytest

from tests.support.agent import batches_in, run_agent

GPU_MESSAGE = "no GPU to read"


def test_once_dry_run_prints_one_batch_that_the_schema_accepts(sysfs, batch_validator):
    result = run_agent(
        "--once", "--dry-run", "--node", "gpu-001", "--sysfs-root", str(sysfs), fake_nvml={"xids": [[1, 79]]}
    )
    assert result.returncode == 0, result.stderr
    (batch,) = batches_in(result.stdout)
    batch_validator.validate(batch)
    assert batch["node"] == "gpu-001"
    assert batch["agent"]["gpu_status"] == "ok"
    assert [r["gpu"] for r in batch["readings"]] == [0, 1]
    assert {n["name"] for n in batch["nics"]} == {"eth0", "eth1", "ib0", "mlx5_1:1"}
    assert [(e["gpu"], e["xid"]) for e in batch["events"]] == [(1, 79)]
    assert batch["readings"][1]["fields"]["DCGM_FI_DEV_XID_ERRORS"] == 79
    assert GPU_MESSAGE not in result.stderr


def test_without_nvml_it_says_so_once_and_keeps_collecting_nics(sysfs, batch_validator):
    result = run_agent(
        "--count",
        "3",
        "--interval",
        "0.05",
        "--dry-run",
        "--node",
        "gpu-001",
        "--sysfs-root",
        str(sysfs),
        fake_nvml={"fail": "library_not_found"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(GPU_MESSAGE) == 1
    assert "NVML Shared Library Not Found" in result.stderr
    assert "collecting NICs only" in result.stderr
    batches = batches_in(result.stdout)
    assert len(batches) == 3
    for batch in batches:
        batch_validator.validate(batch)
        assert batch["readings"] == []
        assert batch["agent"]["gpu_status"] == "no_nvml"
        assert len(batch["nics"]) == 4
    assert len({b["batch_id"] for b in batches}) == 3


def test_require_gpus_exits_non_zero_only_when_there_are_none(sysfs):
    missing = run_agent(
        "--once",
        "--dry-run",
        "--require-gpus",
        "--sysfs-root",
        str(sysfs),
        fake_nvml={"fail": "driver_not_loaded"},
    )
    assert missing.returncode == 2
    assert missing.stderr.count(GPU_MESSAGE) == 1
    assert "--require-gpus" in missing.stderr
    assert missing.stdout == ""

    none = run_agent(
        "--once", "--dry-run", "--require-gpus", "--sysfs-root", str(sysfs), fake_nvml={"gpus": []}
    )
    assert none.returncode == 2
    assert "sees no GPU" in none.stderr

    present = run_agent("--once", "--dry-run", "--require-gpus", "--sysfs-root", str(sysfs), fake_nvml={})
    assert present.returncode == 0, present.stderr


def test_on_this_machine_with_the_real_nvidia_ml_py(sysfs, batch_validator):
    """No fake: nvidia-ml-py itself on a machine without a GPU (as this one is)."""
    result = run_agent("--once", "--dry-run", "--sysfs-root", str(sysfs))
    assert result.returncode == 0, result.stderr
    (batch,) = batches_in(result.stdout)
    batch_validator.validate(batch)
    if batch["agent"]["gpu_status"] == "ok":  # pragma: no cover - a GPU machine
        pytest.skip("this machine has a GPU")
    assert result.stderr.count(GPU_MESSAGE) == 1
    assert batch["agent"]["gpu_status"] == "no_nvml"


def test_sends_to_the_control_plane_with_config_from_the_environment(
    receiver, sysfs, tmp_path, batch_validator
):
    result = run_agent(
        "--once",
        env={
            "LOCKSTEP_URL": receiver.url,
            "LOCKSTEP_TOKEN": "agent-token-xyz",
            "LOCKSTEP_NODE": "gpu-042",
            "LOCKSTEP_SPOOL_DIR": str(tmp_path / "spool"),
            "LOCKSTEP_SYSFS_ROOT": str(sysfs),
        },
        fake_nvml={},
    )
    assert result.returncode == 0, result.stderr
    (batch,) = receiver.batches
    batch_validator.validate(batch)
    assert batch["node"] == "gpu-042"
    assert receiver.headers[0]["Authorization"] == "Bearer agent-token-xyz"
    assert len(batch["readings"]) == 2


def test_an_unreachable_control_plane_spools_and_the_next_run_replays(receiver, sysfs, tmp_path):
    arguments = [
        "--url",
        receiver.url,
        "--token",
        "t",
        "--spool-dir",
        str(tmp_path / "spool"),
        "--sysfs-root",
        str(sysfs),
        "--retries",
        "1",
        "--backoff",
        "0.01",
    ]
    receiver.stop()
    for _ in range(2):
        assert run_agent("--once", *arguments, fake_nvml={}).returncode == 0
    assert len((tmp_path / "spool" / "spool.jsonl").read_text().splitlines()) == 2
    spooled = [
        json.loads(line)["batch_id"] for line in (tmp_path / "spool" / "spool.jsonl").read_text().splitlines()
    ]

    receiver.start()
    assert run_agent("--once", *arguments, fake_nvml={}).returncode == 0
    received = [b["batch_id"] for b in receiver.batches]
    assert received[:2] == spooled
    assert len(received) == 3
    assert not (tmp_path / "spool" / "spool.jsonl").exists()


def test_a_url_is_needed_unless_dry_run(sysfs):
    result = run_agent("--once", "--sysfs-root", str(sysfs), fake_nvml={})
    assert result.returncode == 64
    assert "--url" in result.stderr


def test_an_unusable_spool_directory_is_a_usage_error(sysfs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = run_agent(
        "--once",
        "--url",
        "http://127.0.0.1:9",
        "--spool-dir",
        str(blocker / "spool"),
        "--sysfs-root",
        str(sysfs),
        fake_nvml={},
    )
    assert result.returncode == 64
    assert "cannot use the spool directory" in result.stderr


def test_no_gpus_flag_skips_nvml(sysfs, batch_validator):
    result = run_agent(
        "--once",
        "--dry-run",
        "--no-gpus",
        "--sysfs-root",
        str(sysfs),
        fake_nvml={"fail": "library_not_found"},
    )
    assert result.returncode == 0
    (batch,) = batches_in(result.stdout)
    batch_validator.validate(batch)
    assert batch["agent"]["gpu_status"] == "disabled"
    assert GPU_MESSAGE not in result.stderr


@pytest.mark.parametrize("fake", [{}, {"fail": "library_not_found"}], ids=["with-gpus", "without-gpus"])
def test_sigterm_ends_the_loop_cleanly(sysfs, fake):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support.agent import FAKE_NVML_DIR

    environment = dict(os.environ, PYTHONPATH=str(FAKE_NVML_DIR), FAKE_NVML_CONFIG=json.dumps(fake))
    process = subprocess.Popen(
        [sys.executable, "-m", "lockstep_agent", "--dry-run", "--interval", "30", "--sysfs-root", str(sysfs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        assert process.stdout.readline().startswith("{")  # the first batch is out; now it waits
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
