"""Worker and beat heartbeats: a daemon thread writes a key with a time-to-live to Redis.

/readyz reports them; a missing heartbeat does not take the web process out of service.
"""

import json
import socket
import threading
import time

import redis
from django.conf import settings

PREFIX = "lockstep:heartbeat:"
_stop = threading.Event()


def redis_client(url: str | None = None, timeout: float | None = None) -> redis.Redis:
    timeout = settings.READYZ_TIMEOUT if timeout is None else timeout
    return redis.Redis.from_url(
        url or settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout
    )


def beat_once(role: str, name: str, client: redis.Redis | None = None) -> None:
    client = client or redis_client()
    interval = settings.HEARTBEAT_SECONDS
    value = json.dumps({"role": role, "name": name, "host": socket.gethostname(), "at": time.time()})
    client.set(f"{PREFIX}{role}:{name}", value, ex=interval * 3)


def start_heartbeat(role: str, name: str) -> threading.Thread:
    _stop.clear()

    def loop():
        client = redis_client()
        while not _stop.is_set():
            try:
                beat_once(role, name, client)
            except redis.RedisError:
                pass
            _stop.wait(settings.HEARTBEAT_SECONDS)

    thread = threading.Thread(target=loop, name=f"lockstep-heartbeat-{role}", daemon=True)
    thread.start()
    return thread


def stop_heartbeat() -> None:
    _stop.set()


def read_heartbeats(client: redis.Redis) -> list[dict]:
    beats = []
    for key in client.scan_iter(match=f"{PREFIX}*", count=100):
        raw = client.get(key)
        if raw:
            entry = json.loads(raw)
            entry["age_s"] = round(time.time() - entry.get("at", 0), 1)
            beats.append(entry)
    return sorted(beats, key=lambda b: (b["role"], b["name"]))
