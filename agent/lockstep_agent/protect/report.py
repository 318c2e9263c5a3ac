"""Reports from the protection runtime to Lockstep: ``POST /api/v1/jobs/<id>/snapshots/`` with the job token.

Configured like ``lockstep_agent.progress`` by ``LOCKSTEP_URL``, ``LOCKSTEP_JOB_ID`` and ``LOCKSTEP_JOB_TOKEN``.
A daemon thread sends; restore points are coalesced to at most one every ``min_interval`` seconds
(``LOCKSTEP_PROTECT_INTERVAL``, default 10: the newest is what the planner needs), restores, fallbacks,
write-throughs, hangs and in-place replacements (``peer_lost``,
``rank_replaced``) are always sent, at once. A coalesced report carries the snapshot overhead
(``overhead_seconds``) of the ones it replaced. A failure is logged and counted, never raised into training.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request

log = logging.getLogger("lockstep_agent.protect.report")

ALWAYS = {"restore", "disk_fallback", "write_through", "hang", "peer_lost", "rank_replaced"}


class SnapshotReporter:
    def __init__(
        self, url: str, job_id: int | str, token: str, *, min_interval: float = 10.0, timeout: float = 5.0
    ):
        self.endpoint = f"{url.rstrip('/')}/api/v1/jobs/{int(job_id)}/snapshots/"
        self.token = token
        self.min_interval = min_interval
        self.timeout = timeout
        self.sent = 0
        self.failed = 0
        self.answers: list[dict] = []
        self._last = float("-inf")
        self._pending: list[dict] = []
        self._latest_point: dict | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="lockstep-protect-report", daemon=True)
        self._thread.start()

    @classmethod
    def from_environment(cls) -> SnapshotReporter | None:
        url, job, token = (
            os.environ.get(n) for n in ("LOCKSTEP_URL", "LOCKSTEP_JOB_ID", "LOCKSTEP_JOB_TOKEN")
        )
        if not (url and job and token):
            return None
        return cls(url, job, token, min_interval=float(os.environ.get("LOCKSTEP_PROTECT_INTERVAL", "10")))

    def report(self, body: dict) -> None:
        with self._cond:
            if body.get("kind") in ALWAYS:
                self._pending.append(body)
            else:
                # A newer restore point replaces one not yet sent; the training time the replaced one's snapshots
                # cost still counts, so it carries on in the newer one.
                replaced = self._latest_point or {}
                if replaced.get("overhead_seconds") is not None:
                    body = {
                        **body,
                        "overhead_seconds": round(
                            float(body.get("overhead_seconds") or 0.0) + float(replaced["overhead_seconds"]),
                            6,
                        ),
                    }
                self._latest_point = body
            self._cond.notify()

    def flush(self, timeout: float = 10.0) -> bool:
        """Send what is queued now (restore points too, whatever the interval); True when all was sent."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._last = float("-inf")
            self._cond.notify()
            while (self._pending or self._latest_point or self._busy) and time.monotonic() < deadline:
                self._cond.wait(0.05)
            return not (self._pending or self._latest_point or self._busy)

    def _send(self, body: dict) -> None:
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            self.answers.append(json.loads(response.read() or b"{}"))

    def _next(self) -> dict | None:
        if self._pending:
            return self._pending.pop(0)
        if self._latest_point is not None and time.monotonic() - self._last >= self.min_interval:
            body, self._latest_point = self._latest_point, None
            self._last = time.monotonic()
            return body
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                body = self._next()
                while body is None:
                    self._cond.wait(0.5)
                    body = self._next()
                self._busy = True
            try:
                self._send(body)
                self.sent += 1
            except (urllib.error.URLError, OSError, ValueError) as error:
                self.failed += 1
                detail = (
                    error.read().decode(errors="replace")[:300]
                    if isinstance(error, urllib.error.HTTPError)
                    else ""
                )
                log.warning("protection report to %s failed: %s %s", self.endpoint, error, detail)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
