"""Scratch database and a simulated fleet for the fleet benchmarks (PostgreSQL database ``lockstep_bench``)."""

import os
import sys
from pathlib import Path

BENCH_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lockstep_bench")


def setup() -> None:
    """Create the scratch database if needed, point Django at it, migrate, pin this process to one core."""
    import psycopg

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    name = BENCH_URL.rsplit("/", 1)[1]
    admin_url = BENCH_URL.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = BENCH_URL
    os.environ.setdefault(
        "DJANGO_SETTINGS_MODULE", "controlplane.testing.settings"
    )  # production settings on plain HTTP
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")  # queued steps go to a scratch Redis DB
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE fleet_rolloutcluster, fleet_rolloutbatch, fleet_rollout, fleet_driftfinding, "
            "fleet_observedaddon, fleet_simulatedaddon, fleet_node, fleet_cluster, fleet_fleet, "
            "fleet_blueprintversion, fleet_blueprint, controlplane_event, controlplane_topicsequence, "
            "controlplane_auditentry CASCADE"
        )


def make_fleet(clusters: int, addons: int = 15, track_latest: bool = True):
    """``clusters`` simulated clusters carrying version 1 of a blueprint with ``addons`` add-ons, all healthy."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import Blueprint, BlueprintVersion, Cluster, Fleet, SimulatedAddon

    blueprint = Blueprint.objects.create(name="bench", auto_rollout=False)
    specs = [
        {
            "name": f"addon-{i:02d}",
            "repo": "https://charts.example",
            "chart": f"chart-{i:02d}",
            "version": "1.0.0",
            "namespace": "kube-system",
            "values": {"replicas": 2, "image": {"tag": "v1"}},
        }
        for i in range(addons)
    ]
    version = BlueprintVersion.objects.create(blueprint=blueprint, number=1, state="active", addons=specs)
    fleet = Fleet.objects.create(name="bench")
    rows = Cluster.objects.bulk_create(
        [
            Cluster(
                fleet=fleet,
                name=f"c-{i:05d}",
                blueprint=blueprint,
                blueprint_version=version,
                track_latest=track_latest,
                connection={"apply_seconds": 0},
                labels={"region": f"r{i % 4}"},
            )
            for i in range(clusters)
        ],
        batch_size=2000,
    )
    past = timezone.now() - timedelta(seconds=5)
    SimulatedAddon.objects.bulk_create(
        [
            SimulatedAddon(
                cluster=cluster,
                name=s["name"],
                chart=s["chart"],
                version=s["version"],
                namespace=s["namespace"],
                values=s["values"],
                ready_at=past,
            )
            for cluster in rows
            for s in specs
        ],
        batch_size=5000,
    )
    return blueprint, version, rows
