"""The protection runtime's reporter, against a real HTTP server: coalesced restore points keep the snapshot
overhead of the points they replaced, so the ledger's figure does not depend on how often reports are sent."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from lockstep_agent.protect.report import SnapshotReporter

from tests.support.processes import wait_for


class _Recorder(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_coalesced_restore_points_carry_the_overhead_of_those_they_replaced():
    _Recorder.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = SnapshotReporter(f"http://127.0.0.1:{server.server_port}", 7, "lsj_x_y", min_interval=60)
        reporter.report({"kind": "snapshot", "iteration": 5, "overhead_seconds": 0.1})
        wait_for(lambda: reporter.sent == 1, 10, what="the first restore point")
        # Within the interval: these two wait, and only the newer is sent, carrying both overheads.
        reporter.report({"kind": "snapshot", "iteration": 10, "overhead_seconds": 0.2})
        reporter.report({"kind": "snapshot", "iteration": 15, "overhead_seconds": 0.3})
        reporter.report({"kind": "restore", "iteration": 15, "seconds": 0.5})  # always sent, carries none
        assert reporter.flush()
    finally:
        server.shutdown()
    points = [b for b in _Recorder.bodies if b["kind"] == "snapshot"]
    assert [p["iteration"] for p in points] == [5, 15]
    assert [p["overhead_seconds"] for p in points] == [0.1, 0.5]
    assert reporter.failed == 0 and len(_Recorder.bodies) == 3
