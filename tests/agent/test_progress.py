"""The one-line progress helper against a live Lockstep (uvicorn), with a real job token."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from lockstep_agent import progress

from jobs.models import Job
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import uvicorn_server, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_training_loop_reports_progress_in_one_line(tmp_path, tenant_a, monkeypatch):
    cluster = protected_cluster(nodes=2, spares=0)
    job = submit(cluster, tenant_a, gpus=8, checkpoint_interval=50)
    with uvicorn_server(tmp_path) as server:
        monkeypatch.setenv("LOCKSTEP_URL", server.url)
        monkeypatch.setenv("LOCKSTEP_JOB_ID", str(job.pk))
        monkeypatch.setenv("LOCKSTEP_JOB_TOKEN", job.token)
        monkeypatch.setenv("LOCKSTEP_PROGRESS_INTERVAL", "0")
        monkeypatch.setattr(progress, "_default", None)
        for step in range(1, 101):
            progress.report_progress(step, step_seconds=0.5, checkpoint=step % 50 == 0)
            progress._default.flush()  # one at a time: queued faster than sent, plain reports are coalesced
        assert progress._default.failed == 0
        wait_for(lambda: Job.objects.get(pk=job.pk).iteration == 100, 10, what="the last report")
    job.refresh_from_db()
    assert job.last_checkpoint_iteration == 100 and job.seconds_per_iteration == pytest.approx(0.5)
    assert job.progress.filter(checkpoint=True).count() == 2


def test_wrong_token_or_no_settings_never_breaks_the_loop(monkeypatch):
    for name in ("LOCKSTEP_URL", "LOCKSTEP_JOB_ID", "LOCKSTEP_JOB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "_default", None)
    assert progress.report_progress(1) is False
    reporter = progress.ProgressReporter("http://127.0.0.1:9", 1, "lsj_x_y", min_interval=0, timeout=0.5)
    assert reporter.report(1, checkpoint=True)
    reporter.flush()
    assert reporter.failed == 1 and reporter.sent == 0
    rate_limited = progress.ProgressReporter("http://127.0.0.1:9", 1, "t", min_interval=60)
    assert rate_limited.report(1) and not rate_limited.report(2) and rate_limited.report(3, checkpoint=True)


def test_a_slow_lockstep_gets_the_newest_progress_and_every_checkpoint():
    """Lockstep answering slower than the job reports: the reporter sends every checkpoint and, of the plain
    reports queued behind one answer, only the newest, so what Lockstep knows stays one answer behind."""
    received = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            time.sleep(0.05)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reporter = progress.ProgressReporter(
            f"http://127.0.0.1:{server.server_port}", 1, "lsj_x_y", min_interval=0
        )
        for step in range(1, 201):
            assert reporter.report(step, checkpoint=step % 50 == 0)
            time.sleep(0.002)
        reporter.flush()
    finally:
        server.shutdown()
    iterations = [body["iteration"] for body in received]
    assert iterations == sorted(iterations) and iterations[-1] == 200
    assert [body["iteration"] for body in received if body["checkpoint"]] == [50, 100, 150, 200]
    assert reporter.failed == 0 and reporter.sent == len(received) < 100
    assert reporter.sent + reporter.coalesced == 200
