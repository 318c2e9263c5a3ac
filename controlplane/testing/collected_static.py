"""Settings for a process that serves a collected static tree of its own: the test suite's, with STATIC_ROOT
from LOCKSTEP_STATIC_ROOT. The static-file browser test and bench/first_page.py collect into a scratch folder, so
they neither need nor disturb the checkout's staticfiles/ (which `make run` fills)."""

import os
from pathlib import Path

from controlplane.testing.settings import *  # noqa: F403

STATIC_ROOT = Path(os.environ["LOCKSTEP_STATIC_ROOT"])
