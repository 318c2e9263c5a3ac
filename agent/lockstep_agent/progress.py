"""Report a training job's progress to Lockstep in one line from the training loop.

    from lockstep_agent.progress import report_progress
    ...
    report_progress(step, step_seconds=elapsed, checkpoint=saved_this_step)

Configuration comes from the environment that whatever launched the job set: ``LOCKSTEP_URL`` (the control
plane, e.g. https://lockstep.example), ``LOCKSTEP_JOB_ID`` and ``LOCKSTEP_JOB_TOKEN`` (the ``lsj_…`` token
``POST /api/v1/jobs/`` answered with). Only rank 0 reports (``RANK`` unset or ``0``). Reports are sent by a
background thread at most every ``min_interval`` seconds (a checkpoint is always sent), with a short timeout;
a failure is logged and dropped, never raised: progress reporting must not stop training.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("lockstep_agent.progress")


class ProgressReporter:
    """Sends ``POST /api/v1/jobs/<id>/progress/`` with a job token from a daemon thread."""

    def __init__(
        self, url: str, job_id: int | str, token: str, *, min_interval: float = 10.0, timeout: float = 5.0
    ):
        self.endpoint = f"{url.rstrip('/')}/api/v1/jobs/{int(job_id)}/progress/"
        self.token = token
        self.min_interval = min_interval
        self.timeout = timeout
        self.sent = 0
        self.failed = 0
        self.coalesced = 0  # plain reports left unsent because a newer one was queued behind them
        self.answer: dict = {}  # Lockstep's answer to the last report (``write_through``: it is moving the job)
        self._last = 0.0
        self._queue: queue.Queue[dict | None] = queue.Queue(maxsize=100)
        self._thread = threading.Thread(target=self._run, name="lockstep-progress", daemon=True)
        self._thread.start()

    def report(
        self,
        iteration: int,
        *,
        step_seconds: float | None = None,
        checkpoint: bool = False,
        force: bool = False,
    ) -> bool:
        """Queue a report; returns whether it was queued (skipped when too soon after the last, unless a
        checkpoint or ``force``, or when the queue is full)."""
        now = time.monotonic()
        if not (checkpoint or force) and now - self._last < self.min_interval:
            return False
        body = {"iteration": int(iteration), "checkpoint": bool(checkpoint)}
        if step_seconds is not None and step_seconds > 0:
            body["step_seconds"] = float(step_seconds)
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            return False
        self._last = now
        return True

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until queued reports are sent (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _send(self, body: dict) -> None:
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            answer = json.loads(response.read() or b"{}")
        self.answer = answer if isinstance(answer, dict) else {}

    def _pending(self) -> list[dict | None]:
        """The next report and every one queued behind it."""
        found = [self._queue.get()]
        while True:
            try:
                found.append(self._queue.get_nowait())
            except queue.Empty:
                return found

    def _run(self) -> None:
        """Send what is queued: every checkpoint, and of the plain reports behind it only the newest. When Lockstep
        answers slower than the job reports, a queue sent in full would show it progress ever further behind (92
        steps behind on a loaded test machine); coalesced, at most the reports one answer takes."""
        while True:
            pending = self._pending()
            reports = [body for body in pending if body is not None]
            chosen = [body for body in reports if body["checkpoint"]]
            plain = [body for body in reports if not body["checkpoint"]]
            if plain and (not chosen or plain[-1]["iteration"] > chosen[-1]["iteration"]):
                chosen.append(plain[-1])
            self.coalesced += len(reports) - len(chosen)
            for body in chosen:
                try:
                    self._send(body)
                    self.sent += 1
                except (urllib.error.URLError, OSError, ValueError) as error:
                    self.failed += 1
                    log.warning("progress report to %s failed: %s", self.endpoint, error)
            for _ in pending:
                self._queue.task_done()
            if len(reports) < len(pending):
                return


_default: ProgressReporter | None = None
_lock = threading.Lock()


def _reporter() -> ProgressReporter | None:
    global _default
    with _lock:
        if _default is None:
            url, job, token = (
                os.environ.get(name) for name in ("LOCKSTEP_URL", "LOCKSTEP_JOB_ID", "LOCKSTEP_JOB_TOKEN")
            )
            if not (url and job and token) or os.environ.get("RANK", "0") != "0":
                return None
            _default = ProgressReporter(
                url, job, token, min_interval=float(os.environ.get("LOCKSTEP_PROGRESS_INTERVAL", "10"))
            )
        return _default


def report_progress(iteration: int, *, step_seconds: float | None = None, checkpoint: bool = False) -> bool:
    """The one line for a training loop. Does nothing (returns False) without LOCKSTEP_* settings or off rank 0."""
    reporter = _reporter()
    return reporter.report(iteration, step_seconds=step_seconds, checkpoint=checkpoint) if reporter else False
