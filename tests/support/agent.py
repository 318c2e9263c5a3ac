"""What the node agent's tests are built from: the fake NVML, a live ingest receiver, a fake sysfs tree, running
the agent's command, a real Redfish server (sushy-tools' emulator), and reading the batches the agent prints.
The fixtures over them are in tests/agent/conftest.py. Loopback only."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from tests.support.slack import SLACK

FAKE_NVML_DIR = Path(__file__).parent.parent / "agent" / "fakenvml"
LOOPBACK = "127.0.0.1"


def load_fake_nvml():
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


class Receiver:
    """A small HTTP server standing in for POST /api/v1/ingest/telemetry/: it records what arrives and
    answers with the statuses queued in `answers` (202 once they run out). It can be stopped and started
    again on the same port to make an outage."""

    def __init__(self):
        self.port = free_port()
        self.batches: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        self.answers: list[int] = []
        self.attempts = 0
        self._server = None
        self._thread = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.attempts += 1
                    status = receiver.answers.pop(0) if receiver.answers else 202
                    if status == 202:
                        receiver.batches.append(json.loads(body))
                        receiver.headers.append(dict(self.headers))
                        receiver.paths.append(self.path)
                payload = json.dumps({"detail": "accepted" if status == 202 else "nope"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None


def write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "<symlink-dir>":
            path.mkdir(exist_ok=True)
        else:
            path.write_text(content)


def run_agent(*args: str, fake_nvml: dict | None = None, env: dict | None = None, timeout: float = 60):
    """Run `python -m lockstep_agent` with the fake NVML first on the import path (unless fake_nvml is None,
    which leaves the real nvidia-ml-py, as on a machine without a GPU)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    if fake_nvml is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), environment.get("PYTHONPATH", "")])
        environment["FAKE_NVML_CONFIG"] = json.dumps(fake_nvml)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lockstep_agent", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
    )


def _wait_for(url: str, seconds: float = 20.0) -> None:
    seconds *= SLACK
    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up within {seconds}s")
        time.sleep(0.1)


@contextlib.contextmanager
def running_sushy_emulator(directory: Path, users: dict[str, str] | None = None):
    """sushy-tools' Redfish emulator with its fake systems driver, on a spare loopback port; with `users`
    (name -> password) it requires HTTP basic auth, from an htpasswd file of bcrypt hashes."""
    settings = [
        "SUSHY_EMULATOR_FAKE_DRIVER = True",
        f"SUSHY_EMULATOR_STATE_DIR = {str(directory / 'state')!r}",
        "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'",
    ]
    if users:
        import bcrypt

        htpasswd = directory / "htpasswd"
        htpasswd.write_text(
            "".join(
                f"{name}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                for name, password in users.items()
            )
        )
        settings.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}")
    config = directory / "emulator.conf"
    config.write_text("\n".join(settings) + "\n")
    port = free_port()
    emulator = Path(sys.executable).with_name("sushy-emulator")
    command = [str(emulator)] if emulator.exists() else [sys.executable, "-m", "sushy_tools.emulator.main"]
    log = open(directory / "emulator.log", "w")
    process = subprocess.Popen(
        [*command, "--config", str(config), "--fake", "-i", LOOPBACK, "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://{LOOPBACK}:{port}"
    try:
        _wait_for(f"{url}/redfish/v1/")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def batches_in(stdout: str) -> list[dict]:
    """The JSON batches the agent printed one after another (``--dry-run``)."""
    decoder, position, found = json.JSONDecoder(), 0, []
    text = stdout.strip()
    while position < len(text):
        batch, position = decoder.raw_decode(text, position)
        found.append(batch)
        while position < len(text) and text[position].isspace():
            position += 1
    return found
