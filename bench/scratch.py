"""A scratch PostgreSQL database for a benchmark: dropped and created afresh, Django set up on it, migrated."""

import os
import sys
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


def scratch_database(name: str, **environment: str) -> str:
    """Drop and create database ``name``, point Django at it (plus ``environment``), set up and migrate.
    Returns its URL."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG}/{name}"
    if str(BASE) not in sys.path:
        sys.path.insert(0, str(BASE))
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault(
        "DJANGO_SETTINGS_MODULE", "controlplane.testing.settings"
    )  # production settings on plain HTTP
    os.environ.update(environment)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return url
