"""Liveness and readiness.

/healthz answers while the process runs. /readyz checks the database and Redis, each within
READYZ_TIMEOUT seconds, and answers 503 when either fails; worker and beat heartbeats are reported but do
not take the web process out of service. Anyone may ask whether each part is up; only a signed-in user (session or
bearer token) is told the workers' and beat's names and heartbeat ages and the text of a failed check, which name
hosts of the installation.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from django.conf import settings
from django.db import connections
from django.http import JsonResponse
from django.utils.module_loading import import_string

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


def _signed_in(request) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return True
    header = request.headers.get("Authorization", "")
    if not header.lower().startswith("bearer "):
        return False
    try:
        found, _ = import_string(settings.LOCKSTEP_TOKEN_AUTHENTICATOR)(header[7:].strip(), method="GET")
    except Exception:  # a bad or revoked token: the caller is anonymous
        return False
    return bool(found and found.is_authenticated)


def _outline(check: dict) -> dict:
    return {key: value for key, value in check.items() if key != "error"} | (
        {} if check["ok"] else {"error": "failed"}
    )


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
    if not _signed_in(request):
        body["checks"] = {name: _outline(check) for name, check in body["checks"].items()}
        for part in ("workers", "beat"):
            body[part]["count"] = len(body[part].pop("seen"))
    return JsonResponse(body, status=200 if ready else 503)
