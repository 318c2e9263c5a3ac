"""Counting the SQL statements a benchmark's server processes send, without pg_stat_statements.

The benchmark starts uvicorn as ``uvicorn --factory querycount:asgi`` and Celery as ``celery -A querycount:celery``
(with bench/ on PYTHONPATH). Every Django database connection those processes open then counts the statements it
runs (``connection.execute_wrapper``), and a thread in each process adds its count to the Redis key ``KEY`` every
0.1 s, so the benchmark reads the total from Redis. The count is of statements Django sends (BEGIN and COMMIT are
not statements here, nor COPY).

With ``BENCH_QUERY_SHAPES=1`` each statement's shape (its text with literals and parameter lists folded, the
first 160 characters) is counted too, in the Redis hash ``SHAPES``: where a benchmark's statements come from.
"""

import os
import re
import threading
import time
from collections import Counter

KEY = "bench:queries"
SHAPES = "bench:query-shapes"
_SHAPES = bool(os.environ.get("BENCH_QUERY_SHAPES"))
_count = [0]
_shapes: Counter = Counter()
_lock = threading.Lock()
_flusher: list = [None]  # (pid, thread): a forked worker child starts its own


def _flush_forever(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    while True:
        time.sleep(0.1)
        with _lock:
            n, _count[0] = _count[0], 0
            shapes = dict(_shapes)
            _shapes.clear()
        if n:
            try:
                client.incrby(KEY, n)
                for shape, times in shapes.items():
                    client.hincrby(SHAPES, shape, times)
            except redis.RedisError:
                with _lock:
                    _count[0] += n


def shape(sql: str) -> str:
    """A statement's text with its literals and lists of placeholders folded."""
    sql = re.sub(r"'[^']*'|\b\d+\b", "?", sql)
    return re.sub(r"(%s|\?)(\s*,\s*(%s|\?))+", "…", re.sub(r"\s+", " ", sql))[:160]


def _counting(execute, sql, params, many, context):
    with _lock:
        _count[0] += 1
        if _SHAPES:
            _shapes[shape(sql)] += 1
    if _flusher[0] is None or _flusher[0][0] != os.getpid():
        with _lock:
            _count[0] = (
                1 if _flusher[0] is not None else _count[0]
            )  # what a forked child inherited is its parent's
        thread = threading.Thread(target=_flush_forever, args=(os.environ["REDIS_URL"],), daemon=True)
        _flusher[0] = (os.getpid(), thread)
        thread.start()
    return execute(sql, params, many, context)


def _on_connection(sender, connection, **kwargs) -> None:
    if _counting not in connection.execute_wrappers:
        connection.execute_wrappers.append(_counting)


def install() -> None:
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection, dispatch_uid="bench-querycount")


def asgi():
    """The project's ASGI application, counting."""
    install()
    from controlplane.asgi import application

    return application


def _celery():
    install()
    from controlplane.celery import app

    return app


celery = _celery() if os.environ.get("BENCH_QUERYCOUNT_CELERY") else None
