"""In-job recovery on the test Slurm (tests/slurm/test_in_job_recovery.py): an uninterrupted reference run of the
same training job, and a stand-in for Lockstep's snapshot endpoint that keeps what the runtime reports.

The training job and the node's death are the local Slurm's (``jobs.local_slurm.training``)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from jobs.local_slurm.training import AGENT_DIR, checksums

# Deadlines only bound a failure (the machine may be loaded several times over); each wait returns at once.
SLACK = 3.0


def until(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout * SLACK
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} ({timeout * SLACK:.0f} s)")


def reference_checksums(folder: Path, steps: int, world: int = 2) -> dict[int, str]:
    """The digest of the parameters after each step of an uninterrupted run of the same job (``world`` ranks as
    local processes, no fault, no Slurm): step -> digest."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONPATH": str(AGENT_DIR),
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(world),
            "SLURMD_NODENAME": f"reference{rank}",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        command = [sys.executable, "-m", "lockstep_agent.examples.train_slurm", "--checkpoint-dir"]
        command += [str(folder / "ckpt"), "--steps", str(steps), "--hidden", "64", "--checkpoint-every"]
        command += ["1000000", "--checksums"]
        processes.append(
            subprocess.Popen(
                command,
                env=env,
                stdout=(folder / f"reference-{rank}.out").open("w"),
                stderr=subprocess.STDOUT,
            )
        )
    for process in processes:
        if process.wait(timeout=120 * SLACK) != 0:
            raise RuntimeError(
                f"the reference run failed: {(folder / 'reference-0.out').read_text()[-1500:]}"
            )
    return {line["step"]: line["sha256"] for line in checksums(folder)}


class ReportSink:
    """A stand-in for Lockstep's ``POST /api/v1/jobs/<id>/snapshots/``: keeps each body (``bodies``, in order of
    arrival, with ``received``: when) and answers 201. ``env`` points a job's runtime at it."""

    def __init__(self):
        self.bodies: list[dict] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                sink.bodies.append({**body, "received": time.time(), "path": self.path})
                try:
                    self.send_response(201)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except BrokenPipeError:  # the reporter gave up waiting (a loaded machine); it was received
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def env(self) -> dict:
        return {
            "LOCKSTEP_URL": f"http://127.0.0.1:{self.server.server_address[1]}",
            "LOCKSTEP_JOB_ID": "1",
            "LOCKSTEP_JOB_TOKEN": "in-job-test",
            "LOCKSTEP_PROTECT_INTERVAL": "0.5",
        }

    def of(self, kind: str) -> list[dict]:
        return [body for body in self.bodies if body.get("kind") == kind]

    def __enter__(self) -> "ReportSink":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
