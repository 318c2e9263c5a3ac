"""The OpenAPI tags: one per area (Django app), so Swagger UI groups operations as the folders do.

Plain data, read by the settings (SPECTACULAR_SETTINGS["TAGS"], which orders and describes them) and by the
schema class (controlplane/openapi.py), which tags each operation with the area whose folder holds its view.
"""

# app (the top-level package of a view's module) -> (tag, what its operations are about)
AREAS = {
    "tenancy": ("tenancy", "Tenants, users and API tokens."),
    "fleet": (
        "fleet",
        "Fleets, clusters, nodes, blueprints and their versions, rollouts, drift and the automation switch.",
    ),
    "jobs": (
        "jobs",
        "Training jobs, faults, incidents, recovery actions, snapshots, Slurm launchers and GPU-hours "
        "figures.",
    ),
    "telemetry": (
        "telemetry",
        "Telemetry and Alertmanager ingest, agent tokens, predictions and notifications.",
    ),
    "simulator": ("simulator", "What-if replays of the fleet."),
    "controlplane": ("controlplane", "The API root, the event log and the audit trail."),
}
TAGS = [{"name": tag, "description": description} for tag, description in AREAS.values()]
