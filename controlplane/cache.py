"""Django's Redis cache with one client, and so one connection pool, per process.

Django keeps a cache object per context (``caches`` is an asgiref ``Local``), and under ASGI every request runs in
a context of its own: with the stock backend each request built a new client, a new connection pool and a new
connection to Redis, for the fault-handling mark, the rate limits and anything else that uses the cache. Measured
in ``bench/fault_storm.py``'s web profile: about 5 ms of a 30 ms telemetry report went to connecting. Here the
client is shared by every cache object of the same servers and options (redis-py's pool is thread-safe and starts
afresh in a forked child).
"""

import threading

from django.core.cache.backends import redis as django_redis
from django.utils.functional import cached_property

_clients: dict[tuple, django_redis.RedisCacheClient] = {}
_lock = threading.Lock()


class RedisCache(django_redis.RedisCache):
    @cached_property
    def _cache(self):
        key = (
            self._class,
            tuple(self._servers),
            tuple(sorted((name, repr(value)) for name, value in self._options.items())),
        )
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._class(self._servers, **self._options)
        return client
