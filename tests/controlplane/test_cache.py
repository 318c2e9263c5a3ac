"""The Redis cache shares one client per process: Django builds a cache object per context (under ASGI, each
request that starts with none), and with the stock backend each object connected to Redis anew."""

from concurrent.futures import ThreadPoolExecutor

from django.core.cache import caches


def test_every_cache_object_uses_one_client_and_its_pool():
    def one_request(i: int):
        cache = caches.create_connection("default")  # what a new context gets
        assert cache.add(f"test-cache-shared-{i}", i, timeout=5)
        assert cache.get(f"test-cache-shared-{i}") == i
        cache.delete(f"test-cache-shared-{i}")
        return cache

    with ThreadPoolExecutor(4) as pool:
        used = list(pool.map(one_request, range(16)))
    assert len({id(cache) for cache in used}) == 16
    assert len({id(cache._cache) for cache in used}) == 1
    pool = used[0]._cache._get_connection_pool(write=True)
    assert len(pool._available_connections) + len(pool._in_use_connections) <= 4
