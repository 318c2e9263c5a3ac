"""Settings for the test suite (pyproject's DJANGO_SETTINGS_MODULE): production's, on plain HTTP.

The suite runs with DEBUG off, as production does, but talks to http://127.0.0.1, so it sets PLAIN_HTTP and a
SECRET_KEY of its own unless the environment gives them (docs/security.md). It sets them in the environment, so
the processes tests start (uvicorn, Celery, manage.py) read the same.

The suite's Redis is REDIS_URL (DB 14 by default). pytest-django reads these settings before any conftest.py is
imported, so the default is set here. Under pytest-xdist each worker takes a Redis database of its own, counting
down from that base (``worker_redis_url``), as pytest-django gives it a test database of its own.
"""

import os
import re

_WORKER = re.compile(r"gw(\d+)")


def worker_redis_url(url: str, worker: str) -> str:
    """The Redis URL of xdist worker ``gwN``: the base database minus N (gw0 keeps the base, so DB 14 gives the
    workers 14, 13, 12, …). Everything the suite keeps in Redis (Celery's queues, heartbeats, the cache, the
    Channels prefix, which carries the database number) then belongs to one worker."""
    match = _WORKER.fullmatch(worker)
    if match is None:
        return url
    head, _, tail = url.partition("://")
    location, _, rest = tail.partition("/")
    database, query_mark, query = rest.partition("?")
    base = int(database or 0)
    number = base - int(match.group(1))
    if number < 0:
        raise RuntimeError(
            f"REDIS_URL {url}: xdist worker {worker} would need Redis database {number}; workers count down from "
            "the base database, so give a base of at least the number of workers minus one (DB 14 by default)"
        )
    return f"{head}://{location}/{number}{query_mark}{query}"


os.environ.setdefault("PLAIN_HTTP", "true")
os.environ.setdefault("SECRET_KEY", "lockstep-test-suite-only-key-" + "t" * 40)
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
# Once per worker process: a child that reads these settings again (it inherits both variables) keeps its URL.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker and os.environ.get("LOCKSTEP_TEST_REDIS_WORKER") != _worker:
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _worker)
    if os.environ.get("CELERY_BROKER_URL"):
        os.environ["CELERY_BROKER_URL"] = worker_redis_url(os.environ["CELERY_BROKER_URL"], _worker)
    os.environ["LOCKSTEP_TEST_REDIS_WORKER"] = _worker

from controlplane.settings import *  # noqa: E402,F403
