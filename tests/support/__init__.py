"""What the tests are built from, kept apart from the tests themselves: tests import helpers only from here, never
from ``conftest`` or from one another, and conftest files hold fixtures only.

- ``factories``: factory_boy factories for tenants, users, a small fleet and blueprints, and ``make_*`` shortcuts.
- ``blueprints``, ``jobs``, ``incidents``, ``telemetry``, ``agent``, ``slurm``, ``schema_checks``: each area's
  set-ups (a blueprint on simulated clusters, protected clusters and jobs, telemetry batches, the agent's command).
- ``matrix``: the permission matrix, every page, endpoint and topic declared with who may reach it.
- ``processes``, ``browser``, ``monitoring``, ``slurm_scenario``: real processes (uvicorn, Celery, Redis,
  PostgreSQL), headless Chromium, Prometheus and Alertmanager, the node-death scenario on a real Slurm. Benchmarks
  (``bench/``, which put the repository root on their path) use them too.
"""
