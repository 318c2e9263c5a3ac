"""A clone runs anywhere: `git clone` into an empty folder with nothing beside it, then `make run` there, as a new
user would. The stack must still answer a minute after the login box, with the simulator alive (it used to read
the public data from a folder beside the checkout, and honcho stopped the whole stack with it). And no file of the
product names that folder."""

import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from contextlib import closing

import pytest
import requests

from tests.support.processes import BASE_DIR, PrivateRedis, free_port, wait_for

# What `make run` must keep doing after the box: the simulator posts telemetry, and nothing has stopped.
STAY_UP_SECONDS = 60


def _git(*args: str, cwd=BASE_DIR) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path):
    if not (BASE_DIR / ".git").exists():
        pytest.skip("the checkout is not a git repository")
    empty = tmp_path / "empty"
    empty.mkdir()
    _git("clone", "-q", str(BASE_DIR), str(empty / "lockstep"))
    assert sorted(p.name for p in empty.iterdir()) == ["lockstep"]  # nothing beside it: no shared/
    return empty / "lockstep"


def test_no_file_of_the_product_names_the_folder_beside_the_checkout():
    if not (BASE_DIR / ".git").exists():
        pytest.skip("the checkout is not a git repository")
    named = subprocess.run(
        [
            "git",
            "grep",
            "-l",
            "-e",
            "shared/data",
            "-e",
            '"shared" / "data"',
            "--",
            ".",
            ":!tests/test_clone_run.py",
        ],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert named == []


def _saved_without_a_restart(database) -> int:
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as db:
        return db.execute(
            "SELECT count(*) FROM jobs_recoveryaction WHERE state = 'succeeded' AND NOT dry_run "
            "AND gpu_hours_saved > 0 AND kind IN ('nic_failover', 'live_migration', 'restore_from_snapshot')"
        ).fetchone()[0]


class Output:
    """A process's stdout, read by a thread, so the test can wait on lines without blocking."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)


def test_a_fresh_clone_runs_make_run_and_keeps_running(clone, tmp_path):
    redis_server = PrivateRedis().start()
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "SECRET_KEY",
            "DATABASE_URL",
            "DJANGO_SETTINGS_MODULE",
            "LOCAL_ENV_FILE",
            "DEBUG",
            "VIRTUAL_ENV",
        }
        and not k.startswith(("PYTEST", "MAKE", "MFLAGS"))
    }
    env.update(REDIS_URL=redis_server.url, PYTHONUNBUFFERED="1")
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    process = subprocess.Popen(
        ["make", "run", f"PORT={port}"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = Output(process.stdout)
    url = f"http://127.0.0.1:{port}"
    try:
        # Installing the runtime, migrating a new SQLite file and building the demo world come first.
        wait_for(
            lambda: any(line.rstrip().endswith("┐") for line in output.lines) or process.poll() is not None,
            timeout=600,
            interval=1,
            what="make run's login box",
        )
        assert process.poll() is None, output.text()[-3000:]
        boxed = len(output.lines)
        time.sleep(STAY_UP_SECONDS)
        assert process.poll() is None, output.text()[-3000:]
        later = "\n".join(output.lines[boxed:])
        assert " stopped (rc=" not in later and "Traceback" not in output.text(), output.text()[-3000:]
        assert requests.get(f"{url}/accounts/login/", timeout=10).status_code == 200
        assert requests.get(f"{url}/readyz", timeout=10).status_code == 200
        # The simulator is alive: its agents' telemetry keeps arriving after the box.
        assert "/api/v1/ingest/telemetry/" in later, later[-3000:]
        assert (clone / "var" / "lockstep.sqlite3").exists() and (clone / "var" / "local.env").exists()
        # And it shows what Lockstep does: within minutes (the staged NIC failure strikes a minute after the
        # simulator starts), a protected job recovered without a restart, with GPU-hours saved.
        wait_for(
            lambda: _saved_without_a_restart(clone / "var" / "lockstep.sqlite3"),
            timeout=240,
            interval=2,
            what="a recovery other than a restart with GPU-hours saved",
        )
        assert process.poll() is None, output.text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        redis_server.stop()
        shutil.rmtree(clone / ".venv", ignore_errors=True)
