"""Settings for the test suite (pyproject's DJANGO_SETTINGS_MODULE): production's, on plain HTTP.

The suite runs with DEBUG off, as production does, but talks to http://127.0.0.1, so it sets PLAIN_HTTP and a
SECRET_KEY of its own unless the environment gives them (docs/security.md). It sets them in the environment, so
the processes tests start (uvicorn, Celery, manage.py) read the same.
"""

import os

os.environ.setdefault("PLAIN_HTTP", "true")
os.environ.setdefault("SECRET_KEY", "lockstep-test-suite-only-key-" + "t" * 40)

from controlplane.settings import *  # noqa: E402,F403
