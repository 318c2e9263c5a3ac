"""Delivers batches to POST /api/v1/ingest/telemetry/, in order, losing none.

While the spool is empty a batch is posted directly, with a few quick retries and back-off. If it still
fails it goes to the spool, and from then on every new batch is appended behind it, so order is kept.
Each call to ship() (and drain()) replays the spool oldest first, at most once per back-off period,
stopping at the first failure. The batch_id never changes, so a batch delivered twice (a crash after the
server answered but before the spool recorded it) is recognisable server-side.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from urllib.parse import urlsplit

import requests

from lockstep_agent import __version__
from lockstep_agent.spool import Spool

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest/telemetry/"

# The server will never accept this batch as it is: keep it aside instead of retrying forever.
_REJECTED_STATUSES = {400, 413, 422}


class Outcome(enum.Enum):
    SENT = "sent"
    REJECTED = "rejected"
    RETRY = "retry"


def ingest_url(url: str) -> str:
    """LOCKSTEP_URL may be the control plane's base URL or the full ingest URL."""
    if urlsplit(url).path.rstrip("/").endswith(INGEST_PATH.rstrip("/")):
        return url
    return url.rstrip("/") + INGEST_PATH


class Sender:
    def __init__(
        self,
        *,
        url: str,
        token: str | None,
        spool: Spool,
        timeout: float = 10.0,
        attempts: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        session: requests.Session | None = None,
    ):
        self.url = ingest_url(url)
        self.spool = spool
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = f"lockstep-agent/{__version__}"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"
        self._replay_delay = 0.0
        self._next_replay_at = 0.0

    # --- one HTTP attempt ----------------------------------------------------------------------------------

    def post(self, batch: dict) -> tuple[Outcome, float | None]:
        """One attempt; returns the outcome and, for RETRY, the server's Retry-After if it gave one."""
        batch["sent_at"] = time.time()
        body = json.dumps(batch, separators=(",", ":"))
        try:
            response = self.session.post(
                self.url,
                data=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": batch["batch_id"]},
                timeout=self.timeout,
            )
        except requests.RequestException as error:
            log.warning("control plane unreachable (%s): %s", self.url, error)
            return Outcome.RETRY, None
        status = response.status_code
        # 409: the server already has this batch_id; delivered all the same.
        if 200 <= status < 300 or status == 409:
            return Outcome.SENT, None
        if status in _REJECTED_STATUSES:
            log.error(
                "control plane rejected batch %s (%d): %s", batch["batch_id"], status, response.text[:2000]
            )
            self.spool.reject(batch, f"HTTP {status}: {response.text[:2000]}")
            return Outcome.REJECTED, None
        log.warning("control plane answered %d for batch %s; will retry", status, batch["batch_id"])
        return Outcome.RETRY, _retry_after(response)

    # --- delivery ------------------------------------------------------------------------------------------

    def ship(self, batch: dict) -> Outcome:
        """Deliver or durably spool a new batch. Returns SENT/REJECTED when it reached the server now,
        RETRY when it waits in the spool."""
        if not self.spool.is_empty():
            self.spool.append(batch)
            self.drain()
            return Outcome.RETRY if not self.spool.is_empty() else Outcome.SENT
        outcome = Outcome.RETRY
        for attempt in range(self.attempts):
            outcome, retry_after = self.post(batch)
            if outcome is not Outcome.RETRY:
                return outcome
            if attempt + 1 < self.attempts:
                time.sleep(min(self.max_backoff, retry_after or self.backoff * 2**attempt))
        self.spool.append(batch)
        self._schedule_replay(None)
        log.warning(
            "batch %s spooled in %s until the control plane answers", batch["batch_id"], self.spool.path
        )
        return outcome

    def drain(self, *, force: bool = False) -> int:
        """Replay spooled batches in order until one fails; returns how many reached the server."""
        if not force and time.monotonic() < self._next_replay_at:
            return 0
        delivered = 0
        for end, batch in self.spool.pending():
            outcome, retry_after = self.post(batch)
            if outcome is Outcome.RETRY:
                self._schedule_replay(retry_after)
                return delivered
            self.spool.commit(end)
            delivered += 1
        if delivered:
            log.info("replayed %d spooled batch(es)", delivered)
        self._replay_delay = 0.0
        self._next_replay_at = 0.0
        return delivered

    def _schedule_replay(self, retry_after: float | None) -> None:
        self._replay_delay = min(self.max_backoff, max(self.backoff, self._replay_delay * 2))
        self._next_replay_at = time.monotonic() + (
            retry_after if retry_after is not None else self._replay_delay
        )


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
