"""Liveness and readiness.

/healthz answers while the process runs. /readyz checks the database and Redis, each within
READYZ_TIMEOUT seconds, and answers 503 when either fails; worker and beat heartbeats are reported but do
not take the web process out of service.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from django.conf import settings
from django.db import connections
from django.http import JsonResponse

from controlplane.heartbeat import read_heartbeats, redis_client

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="readyz")


def healthz(request):
    return JsonResponse({"status": "ok"})


def _check_database() -> dict:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    connections["default"].close_if_unusable_or_obsolete()
    return {}


def _check_redis() -> dict:
    client = redis_client()
    client.ping()
    beats = read_heartbeats(client)
    return {"heartbeats": beats}


def _timed(check, timeout: float) -> dict:
    started = time.monotonic()
    future = _pool.submit(check)
    try:
        extra = future.result(timeout=timeout)
        result = {"ok": True, **extra}
    except FutureTimeout:
        result = {"ok": False, "error": f"no answer within {timeout:g}s"}
    except Exception as error:  # the check's own failure, named for the operator
        result = {"ok": False, "error": f"{type(error).__name__}: {error}"[:300]}
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    return result


def readyz(request):
    timeout = settings.READYZ_TIMEOUT
    database = _timed(_check_database, timeout)
    redis_result = _timed(_check_redis, timeout)
    beats = redis_result.pop("heartbeats", [])
    workers = [b for b in beats if b["role"] == "worker"]
    beat = [b for b in beats if b["role"] == "beat"]
    ready = database["ok"] and redis_result["ok"]
    body = {
        "status": "ready" if ready else "not ready",
        "checks": {"database": database, "redis": redis_result},
        "workers": {"ok": bool(workers), "seen": workers, "affects_readiness": False},
        "beat": {"ok": bool(beat), "seen": beat, "affects_readiness": False},
    }
    return JsonResponse(body, status=200 if ready else 503)
