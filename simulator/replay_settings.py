"""Settings for the what-if's real-path replay (``simulator.replay``): production's, on a scratch store.

The replay runs the product's own services against an embedded in-memory SQLite database that the process creates
and loses when it ends, with an in-process channel layer and cache and Celery eager. So nothing it writes can reach
the live fleet's database, Redis or workers, whatever the environment says.
"""

import os
import secrets

os.environ["DATABASE_URL"] = "sqlite://:memory:"
os.environ["CELERY_ALWAYS_EAGER"] = "true"
# Nothing here may reach the live Redis: the risk sweep's streaming detectors keep their state there, and the
# scratch store's node ids are the live fleet's too. A port nothing listens on: the sweep scores without them.
os.environ["REDIS_URL"] = "redis://127.0.0.1:1/0"
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
# no browser, no worker, no sweep: nothing can listen to the scratch store's events, so they are written (their
# topics' sequence numbers are the product's) but not relayed, and stay unsent as when Redis is away
OUTBOX_RELAY = False
# one process, no requests: the rate limiter's need for a cache shared between processes does not arise
SILENCED_SYSTEM_CHECKS = [*SILENCED_SYSTEM_CHECKS, "django_ratelimit.E003"]  # noqa: F405
# The replay's clock is the fault model's own time: a prediction looks PREDICTION_HORIZON_HOURS ahead of it
SIMULATOR_ACCELERATION = 0
# the sweep's note that it scores without the streaming detectors (no Redis here, by design) is not news
_loggers = {**LOGGING.get("loggers", {}), "telemetry.services.prediction": {"level": "ERROR"}}  # noqa: F405
LOGGING = {**LOGGING, "loggers": _loggers}  # noqa: F405
