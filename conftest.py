"""Root conftest: test defaults for the processes tests start (uvicorn, Celery, manage.py), which read them from
the environment. pytest-django reads the suite's own settings before this file is imported, so what the test
process itself must see (REDIS_URL, a worker's Redis database under xdist) is set in controlplane/testing/settings.py.
"""

import os

os.environ.setdefault("HEARTBEAT_SECONDS", "1")
os.environ.setdefault("OUTBOX_RELAY_TIMEOUT", "0.5")
os.environ.setdefault("READYZ_TIMEOUT", "1.0")
# The operations tests read beat's sends and the workers' successes of routine tasks from the processes' logs.
os.environ.setdefault("LOG_ROUTINE_TASKS", "true")
