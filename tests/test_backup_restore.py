"""Backup and restore as docs/operations.md tells it: bin/backup-db, a fresh database, bin/restore-db, migrate; then
the control plane runs on the copy and answers with the same data."""

import re
import sqlite3
import subprocess

import psycopg
import pytest
import requests
from django.db import connection

from controlplane.access import Role
from jobs.models import JobAllocation
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.browser import usable_password
from tests.support.factories import make_user, token_header
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import BASE_DIR, VENV_BIN, child_env, database_url, uvicorn_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "restore-me-9"
# What the API lists, compared whole between the database and its restored copy.
LISTS = [
    "/api/v1/tenants/",
    "/api/v1/fleets/",
    "/api/v1/clusters/",
    "/api/v1/nodes/",
    "/api/v1/faults/",
    "/api/v1/actions/",
    "/api/v1/events/?topic=fleet",
    "/api/v1/audit/",
    "/api/v1/users/",
]


def run(args, **env):
    return subprocess.run(
        [str(a) for a in args],
        cwd=BASE_DIR,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )


def server_url(name: str) -> str:
    return database_url().rsplit("/", 1)[0] + f"/{name}"


def table_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as db:
        tables = [row[0] for row in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return {table: db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] for table in tables}


def admin_execute(sql: str) -> None:
    with psycopg.connect(server_url("postgres"), autocommit=True) as db:
        db.execute(sql)


def logged_in(server, username: str) -> requests.Session:
    session = requests.Session()
    form = session.get(f"{server.url}/accounts/login/", timeout=20).text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    response = session.post(
        f"{server.url}/accounts/login/",
        timeout=20,
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{server.url}/accounts/login/"},
    )
    assert response.status_code == 200 and "/accounts/login/" not in response.url, response.text[:500]
    return session


def populate(tenant):
    """A fleet with a protected cluster, two jobs, a fault handled with a live migration; users and a token."""
    admin = make_user(Role.PROVIDER_ADMIN)
    usable_password(admin, PASSWORD)
    make_user(Role.TENANT_ADMIN, tenant)
    cluster = protected_cluster(nodes=4, spares=2)
    jobs = [
        submit(cluster, tenant, gpus=16, name=f"restore-{i}", checkpoint_interval=10**9) for i in range(2)
    ]
    node = JobAllocation.objects.filter(job=jobs[0]).order_by("rank_start").first().node
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node)
    fault_handle(fault_id=fault.pk)
    recovery_advance(cluster_ids=[cluster.pk])
    return admin, jobs


def test_backup_restore_into_a_fresh_database_serves_the_same_data(tmp_path, tenant_a):
    if connection.vendor != "postgresql":
        pytest.skip("pg_dump and pg_restore are for the PostgreSQL deployment")
    admin, jobs = populate(tenant_a)
    header = token_header(admin, "write")["HTTP_AUTHORIZATION"]
    dump = tmp_path / "lockstep.dump"

    backup = run([BASE_DIR / "bin" / "backup-db", dump])
    assert backup.returncode == 0, backup.stderr
    assert dump.stat().st_size > 10_000 and dump.read_bytes()[:5] == b"PGDMP"  # pg_dump's custom format

    name = f"{connection.settings_dict['NAME']}_restored"
    restored = server_url(name)
    admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin_execute(f'CREATE DATABASE "{name}"')
    try:
        restore = run([BASE_DIR / "bin" / "restore-db", dump], DATABASE_URL=restored)
        assert restore.returncode == 0, restore.stderr
        again = run([BASE_DIR / "bin" / "restore-db", dump], DATABASE_URL=restored)
        assert again.returncode == 1 and "already has" in again.stderr  # never merges into live data
        migrate = run([VENV_BIN / "python", "manage.py", "migrate", "--check"], DATABASE_URL=restored)
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr  # nothing left to apply

        # Every table holds as many rows as the original.
        original_counts = table_counts(database_url())
        assert table_counts(restored) == original_counts
        assert original_counts["jobs_recoveryaction"] >= 1 and original_counts["controlplane_event"] > 10
        print(
            f"dump {dump.stat().st_size} bytes; {sum(original_counts.values())} rows in {len(original_counts)} "
            "tables restored alike"
        )

        auth = {"Authorization": header}
        with uvicorn_server(tmp_path) as original, uvicorn_server(tmp_path, DATABASE_URL=restored) as copy:
            for path in LISTS:
                answers = [
                    requests.get(f"{server.url}{path}", headers=auth, timeout=20)
                    for server in (original, copy)
                ]
                assert [a.status_code for a in answers] == [200, 200], (path, answers[1].text[:300])
                assert answers[0].json() == answers[1].json(), path
                assert answers[0].json()["results"], path
            listed = [
                requests.get(f"{server.url}/api/v1/jobs/", headers=auth, timeout=20).json()["results"]
                for server in (original, copy)
            ]
            assert [(j["id"], j["name"], j["state"]) for j in listed[0]] == [
                (j["id"], j["name"], j["state"]) for j in listed[1]
            ]
            # A page, logged in with the restored password hash and session table.
            page = logged_in(copy, admin.username).get(f"{copy.url}/jobs/", timeout=20)
            assert page.status_code == 200 and all(job.name in page.text for job in jobs)
            # The copy takes writes: its sequences were restored with the rows.
            created = requests.post(
                f"{copy.url}/api/v1/tenants/",
                json={"name": "After restore", "slug": "after"},
                headers=auth,
                timeout=20,
            )
            assert created.status_code == 201, created.text
            tenants = requests.get(f"{copy.url}/api/v1/tenants/", headers=auth, timeout=20).json()["results"]
            assert "After restore" in {t["name"] for t in tenants}
        assert table_counts(database_url())["tenancy_tenant"] == original_counts["tenancy_tenant"]
    finally:
        admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_sqlite_backup_is_a_consistent_copy_of_a_file_in_use(tmp_path):
    """The local-run path: the online backup copies what is still only in the write-ahead log, and the restore
    refuses to overwrite a database."""
    live = tmp_path / "lockstep.sqlite3"
    writer = sqlite3.connect(live)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in the -wal file
    writer.execute("CREATE TABLE reading (id INTEGER PRIMARY KEY, value REAL)")
    writer.executemany("INSERT INTO reading (value) VALUES (?)", [(i / 10,) for i in range(5000)])
    writer.commit()
    assert (tmp_path / "lockstep.sqlite3-wal").stat().st_size > 0
    try:
        backup = run(
            [BASE_DIR / "bin" / "backup-db", tmp_path / "copy.sqlite3"], DATABASE_URL=f"sqlite:///{live}"
        )
        assert backup.returncode == 0, backup.stderr
        target = tmp_path / "restored" / "lockstep.sqlite3"
        restore = run(
            [BASE_DIR / "bin" / "restore-db", tmp_path / "copy.sqlite3"], DATABASE_URL=f"sqlite:///{target}"
        )
        assert restore.returncode == 0, restore.stderr
        again = run(
            [BASE_DIR / "bin" / "restore-db", tmp_path / "copy.sqlite3"], DATABASE_URL=f"sqlite:///{target}"
        )
        assert again.returncode == 1 and "exists" in again.stderr
    finally:
        writer.close()
    copy = sqlite3.connect(target)
    assert copy.execute("SELECT count(*), sum(value) FROM reading").fetchone() == (
        5000,
        pytest.approx(sum(range(5000)) / 10),
    )
    copy.close()
