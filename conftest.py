"""Root conftest: test defaults that must be in the environment before Django reads its settings."""

import os

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("HEARTBEAT_SECONDS", "1")
os.environ.setdefault("OUTBOX_RELAY_TIMEOUT", "0.5")
os.environ.setdefault("READYZ_TIMEOUT", "1.0")
# The operations tests read beat's sends and the workers' successes of routine tasks from the processes' logs.
os.environ.setdefault("LOG_ROUTINE_TASKS", "true")
