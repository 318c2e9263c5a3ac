"""Fixtures for the node agent's tests: a fake NVML, a live ingest receiver, a fake sysfs tree, a real
Redfish server (sushy-tools' emulator) and a server of recorded Redfish responses. Loopback only. What they
are built from is in tests/support/agent.py."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
import pytest
from lockstep_agent.batch import load_schema

from tests.support.agent import LOOPBACK, Receiver, load_fake_nvml, running_sushy_emulator, write_tree

FIXTURES = Path(__file__).parent / "fixtures"


# --- NVML -----------------------------------------------------------------------------------------------------


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


@pytest.fixture
def receiver():
    server = Receiver()
    server.start()
    yield server
    server.stop()


# --- a fake sysfs ---------------------------------------------------------------------------------------------------


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


# --- Redfish servers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sushy_emulator(tmp_path_factory):
    with running_sushy_emulator(tmp_path_factory.mktemp("sushy")) as url:
        yield url


@pytest.fixture(scope="module")
def sushy_emulator_with_auth(tmp_path_factory):
    with running_sushy_emulator(
        tmp_path_factory.mktemp("sushy-auth"), users={"lockstep": "bmc-secret-1"}
    ) as url:
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
            payload = json.dumps(
                body if body is not None else {"error": {"code": "Base.1.0.ResourceMissingAtURI"}}
            ).encode()
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
