"""Settings for the what-if's real-path replay (``simulator.replay``): production's, on a scratch store.

The replay runs the product's own services against an embedded in-memory SQLite database that the process creates
and loses when it ends, with an in-process channel layer and cache and Celery eager. So nothing it writes can reach
the live fleet's database, Redis or workers, whatever the environment says.
"""

import os
import secrets

os.environ["DATABASE_URL"] = "sqlite://:memory:"
os.environ["CELERY_ALWAYS_EAGER"] = "true"
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(48))
os.environ.setdefault("LOG_LEVEL", "WARNING")

from controlplane.settings import *  # noqa: E402,F403

DEBUG = (
    False  # Django keeps every query of a DEBUG process in memory: a long replay runs hundreds of thousands
)
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_TASK_ALWAYS_EAGER = True
CELERY_BROKER_URL = "memory://localhost/"
SCRATCH_REPLAY = True
# one process, no requests: the rate limiter's need for a cache shared between processes does not arise
SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "django_ratelimit.E003"]  # noqa: F405
