"""Hardening (issue 25) with real processes: queues by urgency (a fault is decided while a long what-if holds
the analytics worker; one plain worker still serves every queue) and the proxy headers uvicorn believes."""

import re
import shlex

import pytest
import requests
import yaml
from django.db import close_old_connections

from controlplane.celery import app
from controlplane.tasks import ping_task
from jobs.choices import FaultState
from jobs.models import FaultEvent, JobAllocation
from jobs.services.faults import fault_ingest
from simulator.models import WhatIfRun
from simulator.services.whatifs import whatif_start
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import BASE_DIR, celery_worker, uvicorn_server, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# Long enough to still be running when the fault is decided: tens of seconds on one core.
LONG_WHATIF = {"gpus": 32768, "days": 120}


def test_every_task_that_decides_faults_is_on_the_faults_queue_and_analytics_on_its_own():
    app.loader.import_default_modules()  # every app's tasks.py
    route = app.amqp.router.route
    queue_of = {name: route({}, name)["queue"].name for name in app.tasks if not name.startswith("celery.")}
    for name in (
        "jobs.fault_handle",
        "jobs.fault_sweep",
        "jobs.recovery_advance",
        "controlplane.outbox_sweep",
    ):
        assert queue_of[name] == "faults", name
    for name in (
        "simulator.whatif",
        "telemetry.risk_sweep",
        "telemetry.retention_prune",
        "controlplane.retention_prune",
    ):
        assert queue_of[name] == "analytics", name
    assert {queue.name for queue in app.conf.task_queues} == {"faults", "analytics", "celery"}
    assert set(queue_of.values()) <= {"faults", "analytics", "celery"}


def fault_on_the_job(tenant, users):
    cluster = protected_cluster(nodes=4, spares=1, tenant=tenant)
    job = submit(cluster, tenant, gpus=16)
    return JobAllocation.objects.filter(job=job).select_related("node").first().node


def test_a_fault_reported_during_a_long_what_if_is_decided_before_it_ends(tmp_path, tenant_a, users):
    node = fault_on_the_job(tenant_a, users)
    with (
        celery_worker(tmp_path, queues="analytics") as _analytics,
        celery_worker(tmp_path, queues="faults,celery"),
    ):
        run = whatif_start(actor=users["operator"], config=LONG_WHATIF)
        wait_for(
            lambda: WhatIfRun.objects.get(pk=run.pk).state == WhatIfRun.State.RUNNING,
            60,
            what="the what-if starts",
        )
        fault, _ = fault_ingest(source="agent", kind="nic_down", node=node, nic_name="mlx5_0")
        wait_for(
            lambda: FaultEvent.objects.get(pk=fault.pk).state != FaultState.NEW,
            120,
            interval=0.2,
            what="the fault's decision",
        )
        close_old_connections()
        wait_for(
            lambda: WhatIfRun.objects.get(pk=run.pk).state in (WhatIfRun.State.DONE, WhatIfRun.State.FAILED),
            300,
            interval=0.5,
            what="the what-if's end",
        )
    fault.refresh_from_db()
    run.refresh_from_db()
    assert run.state == WhatIfRun.State.DONE, run.error
    # Order, not time: reported after the replay began, decided before it ended.
    assert run.started_at < fault.received_at < fault.handled_at < run.finished_at, (
        run.started_at,
        fault.received_at,
        fault.handled_at,
        run.finished_at,
    )
    assert fault.actions.exists()
    print(
        f"\nwhat-if ran {(run.finished_at - run.started_at).total_seconds():.1f} s on the analytics worker; the fault "
        f"reported {(fault.received_at - run.started_at).total_seconds():.1f} s into it was decided "
        f"{(fault.handled_at - fault.received_at).total_seconds():.2f} s after its report, "
        f"{(run.finished_at - fault.handled_at).total_seconds():.1f} s before the what-if ended"
    )


def test_one_plain_worker_without_queues_serves_them_all(tmp_path, tenant_a, users):
    node = fault_on_the_job(tenant_a, users)
    with celery_worker(tmp_path):  # no -Q, as a small deployment runs it
        assert ping_task.delay("any").get(timeout=30)["echo"] == "any"  # queue `celery`
        fault, _ = fault_ingest(
            source="agent", kind="nic_down", node=node, nic_name="mlx5_0"
        )  # queue `faults`
        wait_for(
            lambda: FaultEvent.objects.get(pk=fault.pk).state != FaultState.NEW,
            60,
            what="the fault's decision",
        )
        run = whatif_start(actor=users["operator"], config={"gpus": 1024, "days": 1})  # queue `analytics`
        wait_for(
            lambda: WhatIfRun.objects.get(pk=run.pk).state == WhatIfRun.State.DONE, 120, what="the what-if"
        )


def test_the_deployments_start_dedicated_workers_and_keep_a_service_named_worker():
    procfile = dict(
        line.split(": ", 1) for line in (BASE_DIR / "Procfile").read_text().splitlines() if ": " in line
    )
    assert "-Q faults,celery" in procfile["worker"] and "-Q analytics" in procfile["analytics"]
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())["services"]
    assert "faults" in shlex.join(compose["worker"]["command"])
    assert "analytics" in shlex.join(compose["worker-analytics"]["command"])
    assert "analytics" in (BASE_DIR / "Makefile").read_text()


# --- the proxy headers uvicorn believes -------------------------------------------------------------------------


def login_attempts(server, addresses, prefix) -> list[int]:
    statuses = []
    for n, address in enumerate(addresses):
        session = requests.Session()
        session.get(f"{server.url}/accounts/login/", timeout=10)
        token = session.cookies.get("csrftoken")
        answer = session.post(
            f"{server.url}/accounts/login/",
            timeout=10,
            allow_redirects=False,
            data={"username": f"{prefix}-{n}", "password": "wrong", "csrfmiddlewaretoken": token},
            headers={"X-Forwarded-For": address, "Referer": f"{server.url}/accounts/login/"},
        )
        statuses.append(answer.status_code)
    return statuses


def test_a_client_on_the_host_cannot_rotate_its_address_with_x_forwarded_for(tmp_path):
    procfile_web = next(
        line for line in (BASE_DIR / "Procfile").read_text().splitlines() if line.startswith("web:")
    )
    assert '--forwarded-allow-ips "${FORWARDED_ALLOW_IPS:-}"' in procfile_web
    assert re.search(r'^ENV FORWARDED_ALLOW_IPS=""$', (BASE_DIR / "Dockerfile").read_text(), re.M)
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
    assert compose["x-lockstep-environment"]["FORWARDED_ALLOW_IPS"] == "${FORWARDED_ALLOW_IPS:-}"
    limits = {"LOGIN_ADDRESS_RATE": "3/hour", "LOGIN_RATE": "100/hour"}
    with uvicorn_server(
        tmp_path, FORWARDED_ALLOW_IPS="", **limits
    ) as server:  # as every deployment starts it
        statuses = login_attempts(server, [f"203.0.113.{n}" for n in range(5)], "rotating")
    assert statuses[:3] == [200] * 3 and statuses[3:] == [429, 429], statuses
    # The same requests from behind a proxy that is trusted do count per forwarded address: the test can tell.
    with uvicorn_server(tmp_path, FORWARDED_ALLOW_IPS="127.0.0.1", **limits) as server:
        statuses = login_attempts(server, [f"198.51.100.{n}" for n in range(5)], "proxied")
    assert 429 not in statuses, statuses
