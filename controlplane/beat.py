"""One beat schedules, however many are started: a Redis lock, taken before the scheduler ticks.

Every `celery -A controlplane beat` runs LockedScheduler (controlplane/celery.py names it). Before each tick a beat
renews the lock ``lockstep:beat:lock`` if it holds it, or tries to take it; only the holder sends periodic tasks,
the others stand by and try again every ``renew_seconds``. The lock lives ``lock_seconds`` (three heartbeat
intervals), so when the holder dies without releasing it (SIGKILL, a lost host) another beat takes over within
that time; a holder that stops cleanly releases it, and the next one takes over at its next try.

The lock's value names its holder (``host:pid:random``): ``redis-cli GET lockstep:beat:lock`` says which beat
schedules. The time each entry last ran is kept in Redis too (``lockstep:beat:last-run``), so a beat that takes
over goes on from where the last holder stopped instead of starting every interval afresh.

Redis holds nothing durable here. When Redis restarts (the lock and the last runs gone), the holder's renewal
fails, it stands down, and whichever beat asks first takes the lock again; periodic tasks resume within one
``renew_seconds``. While Redis is away nothing can be sent anyway (it is the broker), and a beat that cannot reach
it sends nothing. (celery-redbeat was weighed and not taken: its schedule lives only in Redis, so a Redis restart
empties it until beat restarts, and a lock it can no longer extend ends the beat process.)
"""

import logging
import os
import secrets
import socket
from datetime import UTC, datetime

import redis
from celery.beat import PersistentScheduler
from celery.utils.time import maybe_make_aware
from django.conf import settings
from redis.exceptions import LockError

log = logging.getLogger(__name__)

LOCK_KEY = "lockstep:beat:lock"
LAST_RUN_KEY = "lockstep:beat:last-run"


class LockedScheduler(PersistentScheduler):
    """Celery's file-backed scheduler that ticks only while it holds the beat lock."""

    def __init__(self, *args, **kwargs):
        self.lock_seconds = max(3, 3 * settings.HEARTBEAT_SECONDS)
        self.renew_seconds = self.lock_seconds / 3
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.leading = False
        timeout = max(1.0, self.renew_seconds / 2)
        self.redis = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self.lock = self.redis.lock(LOCK_KEY, timeout=self.lock_seconds, blocking=False, thread_local=False)
        super().__init__(*args, **kwargs)

    # --- the lock -------------------------------------------------------------------------------------------

    def hold(self) -> bool:
        """Renew the lock if this beat holds it, or take it if it is free; True when this beat may schedule."""
        try:
            if self.leading:
                try:
                    self.lock.reacquire()  # back to a full lock_seconds; raises when it is no longer ours
                    return True
                except LockError:
                    self.leading = False
                    log.warning("beat: lost the lock %s; standing by", LOCK_KEY)
            if self.lock.acquire(blocking=False, token=self.holder):
                self.leading = True
                log.info("beat: took the lock %s as %s; scheduling", LOCK_KEY, self.holder)
                self.resume_from_last_runs()
                return True
        except redis.RedisError as error:
            # Unreachable: send nothing this tick. A lock still ours is renewed at the next one that answers.
            log.warning("beat: Redis does not answer (%r); sending nothing until it does", error)
        return False

    def resume_from_last_runs(self) -> None:
        """Take the last run of each entry from Redis where it is newer than this beat's own."""
        stored = self.redis.hgetall(LAST_RUN_KEY)
        changed = False
        for name, entry in self.schedule.items():
            raw = stored.get(name.encode())
            if raw is None:
                continue
            last_run = datetime.fromtimestamp(float(raw), tz=UTC)
            if entry.last_run_at is None or last_run > maybe_make_aware(entry.last_run_at):
                entry.last_run_at = last_run
                changed = True
        if changed:
            self._heap = None  # rebuilt from the entries at the next tick

    # --- celery.beat.Scheduler ------------------------------------------------------------------------------

    def tick(self, *args, **kwargs):
        if not self.hold():
            return self.renew_seconds
        return min(super().tick(*args, **kwargs), self.renew_seconds)

    def apply_entry(self, entry, producer=None):
        super().apply_entry(entry, producer=producer)
        last_run = self.schedule.get(entry.name, entry).last_run_at
        try:
            self.redis.hset(LAST_RUN_KEY, entry.name, str(maybe_make_aware(last_run).timestamp()))
        except redis.RedisError:
            pass  # the next holder starts that entry's interval afresh

    def close(self):
        if self.leading:
            try:
                self.lock.release()  # the next beat need not wait for it to expire
                log.info("beat: released the lock %s", LOCK_KEY)
            except (LockError, redis.RedisError):
                pass
            self.leading = False
        super().close()

    @property
    def info(self):
        return f"{super().info}\n    . lock -> {LOCK_KEY} (expires after {self.lock_seconds}s unless renewed)"
