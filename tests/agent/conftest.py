"""Fixtures for the node agent's tests: a fake NVML, a live ingest receiver, a fake sysfs tree, a real
Redfish server (sushy-tools' emulator) and a server of recorded Redfish responses. Loopback only."""

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

import jsonschema
import pytest
import requests
from lockstep_agent.batch import load_schema

HERE = Path(__file__).parent
FAKE_NVML_DIR = HERE / "fakenvml"
FIXTURES = HERE / "fixtures"
LOOPBACK = "127.0.0.1"


# --- NVML -----------------------------------------------------------------------------------------------------


def load_fake_nvml():
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML_DIR / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_nvml(monkeypatch):
    """The fake pynvml, in sys.modules where the agent imports it; configure() it per test."""
    module = load_fake_nvml()
    module.configure()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


# --- the batch schema -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def batch_validator():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


# --- a live ingest receiver ---------------------------------------------------------------------------------------


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


@pytest.fixture
def receiver():
    server = Receiver()
    server.start()
    yield server
    server.stop()


# --- a fake sysfs ---------------------------------------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "<symlink-dir>":
            path.mkdir(exist_ok=True)
        else:
            path.write_text(content)


@pytest.fixture
def sysfs(tmp_path):
    """A sysfs tree like an HGX node's: eth0 (Ethernet, up), ib0 (IPoIB over mlx5_0 port 1, ACTIVE),
    mlx5_1 port 1 without a netdev and DOWN, eth1 administratively down, lo (virtual)."""
    root = tmp_path / "sys"
    net = "class/net"
    ib = "class/infiniband"
    write_tree(
        root,
        {
            f"{net}/lo/operstate": "unknown\n",
            f"{net}/lo/carrier": "1\n",
            f"{net}/lo/type": "772\n",
            f"{net}/eth0/device/vendor": "0x15b3\n",
            f"{net}/eth0/operstate": "up\n",
            f"{net}/eth0/carrier": "1\n",
            f"{net}/eth0/type": "1\n",
            f"{net}/eth0/speed": "100000\n",
            f"{net}/eth0/carrier_changes": "4\n",
            f"{net}/eth0/carrier_up_count": "2\n",
            f"{net}/eth0/carrier_down_count": "2\n",
            f"{net}/eth0/statistics/rx_errors": "0\n",
            f"{net}/eth0/statistics/tx_errors": "0\n",
            f"{net}/eth0/statistics/rx_crc_errors": "7\n",
            f"{net}/eth1/device/vendor": "0x15b3\n",
            f"{net}/eth1/operstate": "down\n",
            f"{net}/eth1/type": "1\n",
            f"{net}/eth1/carrier_changes": "0\n",
            f"{net}/ib0/device/vendor": "0x15b3\n",
            f"{net}/ib0/operstate": "up\n",
            f"{net}/ib0/carrier": "1\n",
            f"{net}/ib0/type": "32\n",
            f"{net}/ib0/carrier_changes": "9\n",
            f"{ib}/mlx5_0/device/net/ib0/type": "32\n",
            f"{ib}/mlx5_0/ports/1/state": "4: ACTIVE\n",
            f"{ib}/mlx5_0/ports/1/phys_state": "5: LinkUp\n",
            f"{ib}/mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n",
            f"{ib}/mlx5_0/ports/1/link_layer": "InfiniBand\n",
            f"{ib}/mlx5_0/ports/1/counters/symbol_error": "12\n",
            f"{ib}/mlx5_0/ports/1/counters/link_downed": "3\n",
            f"{ib}/mlx5_0/ports/1/counters/port_rcv_errors": "5\n",
            f"{ib}/mlx5_0/ports/1/counters/link_error_recovery": "1\n",
            f"{ib}/mlx5_1/ports/1/state": "1: DOWN\n",
            f"{ib}/mlx5_1/ports/1/phys_state": "3: Disabled\n",
            f"{ib}/mlx5_1/ports/1/rate": "10 Gb/sec (4X SDR)\n",
            f"{ib}/mlx5_1/ports/1/link_layer": "InfiniBand\n",
            f"{ib}/mlx5_1/ports/1/counters/symbol_error": "0\n",
            f"{ib}/mlx5_1/ports/1/counters/link_downed": "255\n",
            f"{ib}/mlx5_1/ports/1/counters/port_rcv_errors": "0\n",
        },
    )
    return root


# --- running the command ------------------------------------------------------------------------------------------


def run_agent(*args: str, fake_nvml: dict | None = None, env: dict | None = None, timeout: float = 60):
    """Run `python -m lockstep_agent` with the fake NVML first on the import path (unless fake_nvml is None,
    which leaves the real nvidia-ml-py, as on a machine without a GPU)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    if fake_nvml is not None:
        environment["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML_DIR), environment.get("PYTHONPATH", "")])
        environment["FAKE_NVML_CONFIG"] = json.dumps(fake_nvml)
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "lockstep_agent", *args], capture_output=True, text=True, env=environment, timeout=timeout
    )


# --- Redfish servers ------------------------------------------------------------------------------------------------


def _wait_for(url: str, seconds: float = 20.0) -> None:
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
            "".join(f"{name}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n" for name, password in users.items())
        )
        settings.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}")
    config = directory / "emulator.conf"
    config.write_text("\n".join(settings) + "\n")
    port = free_port()
    emulator = Path(sys.executable).with_name("sushy-emulator")
    command = [str(emulator)] if emulator.exists() else [sys.executable, "-m", "sushy_tools.emulator.main"]
    log = open(directory / "emulator.log", "w")
    process = subprocess.Popen(
        [*command, "--config", str(config), "--fake", "-i", LOOPBACK, "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
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


@pytest.fixture(scope="module")
def sushy_emulator(tmp_path_factory):
    with running_sushy_emulator(tmp_path_factory.mktemp("sushy")) as url:
        yield url


@pytest.fixture(scope="module")
def sushy_emulator_with_auth(tmp_path_factory):
    with running_sushy_emulator(tmp_path_factory.mktemp("sushy-auth"), users={"lockstep": "bmc-secret-1"}) as url:
        yield url


@pytest.fixture(scope="module")
def redfish_mockup():
    """Recorded Redfish responses (tests/agent/fixtures/redfish-mockup.json, path -> body, in the shape of
    DMTF's published mockups) served over HTTP for what the emulator does not serve."""
    responses = json.loads((FIXTURES / "redfish-mockup.json").read_text())
    responses.pop("_comment", None)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            body = responses.get(path) or responses.get(path.rstrip("/"))
            payload = json.dumps(body if body is not None else {"error": {"code": "Base.1.0.ResourceMissingAtURI"}}).encode()
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("OData-Version", "4.0")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
