"""Migrations: the models and the migrations agree, and the latest migration of each app applies to a populated
database while it serves, without a failed request (the expand/contract rules are in docs/operations.md)."""

import json
import subprocess
import threading
import time
from io import StringIO

import pytest
import requests
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.loader import MigrationLoader

from controlplane.access import Role
from fleet.services.blueprints import version_create
from fleet.services.rollouts import rollout_start
from jobs.models import JobAllocation
from jobs.services.faults import fault_handle, fault_ingest
from jobs.services.snapshots import snapshot_report
from telemetry.services.ingest import telemetry_ingest
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.browser import usable_password
from tests.support.factories import make_node, make_user, token_header
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import BASE_DIR, VENV_BIN, child_env, uvicorn_server
from tests.support.telemetry import batch, nic, reading

PROJECT_APPS = ("controlplane", "tenancy", "fleet", "jobs", "telemetry", "simulator")
PASSWORD = "migrate-me-9"
# What a running web process answers while the migration runs: API lists, pages, health.
ENDPOINTS = [
    "/healthz",
    "/api/v1/tenants/",
    "/api/v1/fleets/",
    "/api/v1/clusters/",
    "/api/v1/nodes/",
    "/api/v1/blueprints/",
    "/api/v1/rollouts/",
    "/api/v1/drift/",
    "/api/v1/jobs/",
    "/api/v1/faults/",
    "/api/v1/actions/",
    "/api/v1/events/?topic=fleet",
    "/api/v1/predictions/",
    "/api/v1/stats/",
]
PAGES = ["/", "/fleet/", "/rollouts/", "/jobs/"]


@pytest.mark.django_db
def test_models_and_migrations_agree():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def latest_steps(loader: MigrationLoader) -> list[tuple[str, str, str]]:
    """(app, latest migration, the one before) for each app whose latest migration has a predecessor of its own
    app and nothing depending on it (so stepping back touches that migration alone)."""
    steps = []
    for app in PROJECT_APPS:
        for leaf in loader.graph.leaf_nodes(app):
            node = loader.graph.node_map[leaf]
            parents = [parent.key for parent in node.parents if parent.key[0] == app]
            if parents and not node.children:
                steps.append((app, leaf[1], parents[0][1]))
    return steps


def previous_release_models(loader: MigrationLoader, steps) -> list:
    """The models as the previous release knew them (the migration state before each latest step): the code of
    the release that is still serving while the new one's migrations run. Only those the steps touch."""
    stepped = {app: previous for app, _, previous in steps}
    nodes = [
        (app, stepped[app]) if app in stepped else leaf
        for app in PROJECT_APPS
        for leaf in loader.graph.leaf_nodes(app)
    ]
    state = loader.project_state(nodes, at_end=True)
    models = []
    for app, latest, _ in steps:
        for operation in loader.get_migration(app, latest).operations:
            name = getattr(operation, "model_name", None) or getattr(operation, "name", "")
            try:
                model = state.apps.get_model(app, name)
            except LookupError:  # a model the step creates: the previous release never touches it
                continue
            if model not in models:
                models.append(model)
    return models


def use_as_previous_release(model) -> None:
    """What the previous release's code does with a row: read, insert and update with the columns it knows.
    The row is deleted and inserted again, then all rolled back, so any table works without knowing its keys."""
    rows = list(model.objects.order_by("pk")[:20])
    if not rows:
        return
    row = rows[0]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                f'DELETE FROM "{model._meta.db_table}" WHERE "{model._meta.pk.column}" = %s', [row.pk]
            )
        row.save(force_insert=True)
        row.save()
        transaction.set_rollback(True)


def as_previous_release_reads(models) -> dict:
    """Every row of the touched tables, as the previous release's code reads it."""
    return {model.__name__: list(model.objects.order_by("pk").values()) for model in models}


def populate(tenant):
    operator = make_user(Role.OPERATOR)
    usable_password(operator, PASSWORD)
    bp, v1 = blueprint(operator, auto_rollout=False)
    clusters = clusters_on(v1, 3)
    nodes = [
        make_node(cluster, f"mig-{cluster.pk}-{i}", gpus=8, nics=2) for cluster in clusters for i in range(2)
    ]
    v2 = version_create(
        actor=operator, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True
    )
    rollout_start(actor=operator, version=v2, targets={"tracking": True}, strategy={"batch_size": 1})
    now = time.time()
    for node in nodes:
        body = batch(
            node.hostname,
            readings=[reading(g, now - 10) for g in range(8)] + [reading(g, now) for g in range(8)],
            nics=[nic("mlx5_0", now - 10), nic("mlx5_0", now, symbol_error=5)],
        )
        telemetry_ingest(cluster=node.cluster, body=json.dumps(body).encode())
    cluster = protected_cluster(nodes=4, spares=2)
    job = submit(cluster, tenant, gpus=16, checkpoint_interval=10**9)
    fault, _ = fault_ingest(
        source="agent",
        kind="node_unreachable",
        node=JobAllocation.objects.filter(job=job).order_by("rank_start").first().node,
    )
    fault_handle(fault_id=fault.pk)
    snapshot_report(
        job=job,
        kind="snapshot",
        iteration=1,
        seconds=0.05,
        size_bytes=15_000_000,
        locations=[{"rank": 0, "own": "n0", "replica": "n1"}],
    )
    from jobs.launchers import launcher_credential_create
    from jobs.models import SlurmJob

    SlurmJob.objects.create(
        job=job, cluster=cluster, slurm_job_id="4242", account="acme", slurm_state="RUNNING"
    )
    launcher_credential_create(actor=operator, cluster=cluster, name="migrate")
    return operator


def logged_in(server, username) -> requests.Session:
    import re

    session = requests.Session()
    form = session.get(f"{server.url}/accounts/login/", timeout=20).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    response = session.post(
        f"{server.url}/accounts/login/",
        timeout=20,
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
    )
    assert "/accounts/login/" not in response.url, response.text[:300]
    return session


class Load:
    """While a migration runs: the previous release's code using the tables it touches (in this process, with the
    models of the migration state before it), and a web process polled on every endpoint that answers."""

    def __init__(self, web, session, auth, paths, old_models):
        self.web, self.session, self.auth, self.paths, self.old_models = web, session, auth, paths, old_models
        self.stop = threading.Event()
        self.requests, self.failures, self.slowest = 0, [], 0.0
        self.writes, self.write_failures = 0, []
        self.threads = [threading.Thread(target=self.previous_release), threading.Thread(target=self.poll)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *exc):
        time.sleep(1)
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def previous_release(self):
        try:
            while not self.stop.is_set():
                for model in self.old_models:
                    try:
                        use_as_previous_release(model)
                        self.writes += 1
                    except Exception as error:
                        self.write_failures.append(f"{model.__name__}: {error!r}")
                time.sleep(0.01)
        finally:
            connection.close()

    def poll(self):
        while not self.stop.is_set():
            for path in self.paths:
                started = time.monotonic()
                try:
                    response = self.session.get(f"{self.web.url}{path}", headers=self.auth, timeout=30)
                    ok, detail = response.status_code == 200, f"{response.status_code} {response.text[:200]}"
                except requests.RequestException as error:
                    ok, detail = False, repr(error)
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.requests += 1
                if not ok:
                    self.failures.append(f"{path}: {detail}")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_latest_migrations_apply_to_a_populated_database_while_it_serves(tmp_path, tenant_a):
    """For each app's latest migration: step the populated database back over it, then apply it with
    `manage.py migrate` while a web process serves and the previous release's code writes the tables it touches."""
    operator = populate(tenant_a)
    auth = {"Authorization": token_header(operator, "read")["HTTP_AUTHORIZATION"]}
    loader = MigrationLoader(connection)
    steps = latest_steps(loader)
    assert steps, "no app has a second migration to step back over"
    report = []
    try:
        with uvicorn_server(tmp_path) as web:
            session = logged_in(web, operator.username)
            for step in steps:
                app, latest, previous = step
                old_models = previous_release_models(loader, [step])
                for model in old_models:
                    assert model.objects.exists(), f"populate() should give {model.__name__} a row"
                call_command("migrate", app, previous, verbosity=0)  # the previous release's schema
                read_before = as_previous_release_reads(old_models)
                serving = [
                    p
                    for p in ENDPOINTS + PAGES
                    if session.get(f"{web.url}{p}", headers=auth, timeout=30).status_code == 200
                ]
                assert "/healthz" in serving and len(serving) >= 3, (step, serving)
                with Load(web, session, auth, serving, old_models) as load:
                    started = time.monotonic()
                    migrate = subprocess.run(
                        [str(VENV_BIN / "python"), "manage.py", "migrate", "--noinput"],
                        cwd=BASE_DIR,
                        env=child_env(),
                        capture_output=True,
                        text=True,
                        timeout=300,
                    )
                    took = time.monotonic() - started
                read_after = as_previous_release_reads(old_models)
                assert migrate.returncode == 0, migrate.stdout + migrate.stderr
                assert f"Applying {app}.{latest}" in migrate.stdout, migrate.stdout
                summary = (
                    f"{app}.{latest} in {took:.1f} s: {load.requests} requests to {len(serving)} endpoints "
                    f"(slowest {load.slowest:.2f} s), {load.writes} previous-release writes to "
                    f"{[m.__name__ for m in old_models]}, {len(load.failures + load.write_failures)} failed"
                )
                declared = getattr(loader.get_migration(app, latest), "needs_downtime", "")
                if (
                    declared
                ):  # deployed with the previous release stopped (docs/operations.md): applies, that is all
                    report.append(f"{summary} (declares needs_downtime)")
                    continue
                advice = (
                    f"{app}.{latest} is not safe to apply while the previous release runs: make it "
                    "expand/contract, or declare needs_downtime = '<why>' in it (docs/operations.md)"
                )
                assert not load.failures, (advice, load.failures[:5])
                assert not load.write_failures, (advice, load.write_failures[:5])
                # The previous release reads what it read before: no column changed its meaning under it.
                for name, rows in read_before.items():
                    changed = [
                        {key: (old[key], new[key]) for key in old if old[key] != new[key]}
                        for old, new in zip(rows, read_after[name], strict=True)
                        if old != new
                    ]
                    assert not changed, (advice, f"{name} reads differently now (before, after)", changed[:2])
                assert load.requests > len(serving) and (load.writes > 0 or not old_models), step
                assert load.slowest < 10, f"{step}: a request waited {load.slowest:.1f} s on the migration"
                report.append(summary)
            # The new release answers everything.
            for path in ENDPOINTS + PAGES:
                response = session.get(f"{web.url}{path}", headers=auth, timeout=30)
                assert response.status_code == 200, (path, response.text[:300])
    finally:
        call_command("migrate", verbosity=0)
    print("; ".join(report))
