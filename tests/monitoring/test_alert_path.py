"""The monitoring stack GPU clusters run, for real: Debian's Prometheus and Alertmanager on ports of their own,
running the shipped configuration (deploy/) with shorter intervals, against a real Lockstep (uvicorn, a prefork
Celery worker) and the node agent with its NVML replaced at the import boundary.

The agent's GPU 0 raises Xid 79. The agent reports it itself; Prometheus scrapes the agent's dcgm-exporter-named
/metrics, the shipped GPUXidError rule fires, Alertmanager posts it to Lockstep's webhook. Both reports are one
fault in one incident, and the recovery is decided once. The alert resolves (its code has stood for the rule's
window) and is recorded on its fault; the recovery stands. Prometheus scrapes Lockstep's /metrics with the token,
the shipped rules all evaluate, and every query of the shipped Grafana dashboard returns a series."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from controlplane.access import Role
from jobs.choices import ActionState, JobState
from jobs.models import FaultEvent, Incident, JobAllocation, RecoveryAction
from telemetry.models import AlertRecord
from telemetry.services.tokens import agent_token_create
from tenancy import services
from tests.support import monitoring
from tests.support.factories import make_user
from tests.support.jobs import beat_in_a_thread, protected_cluster, submit
from tests.support.processes import celery_worker, free_port, stop_group, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(settings.BASE_DIR)
FAKE_NVML = ROOT / "tests" / "agent" / "fakenvml"
DASHBOARD = ROOT / "docs" / "grafana-lockstep.json"
XID_WINDOW = "20s"  # the Xid rule's ten-minute window, shortened so the alert resolves within the test


@pytest.fixture
def stack_available():
    why = monitoring.available()
    if why:
        pytest.skip(why)


def start_agent(
    tmp_path: Path, *, url: str, token: str, node: str, port: int, xids: list
) -> subprocess.Popen:
    """`python -m lockstep_agent` with the fake NVML first on its path, serving /metrics on ``port``."""
    (tmp_path / "sys").mkdir(exist_ok=True)  # no NICs: this test is about the GPU
    env = {key: value for key, value in os.environ.items() if not key.startswith("LOCKSTEP_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(FAKE_NVML), str(ROOT / "agent")]),
        FAKE_NVML_CONFIG=json.dumps({"xids": xids}),
        PYTHONUNBUFFERED="1",
    )
    log = (tmp_path / "agent.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockstep_agent",
            "--url",
            url,
            "--token",
            token,
            "--node",
            node,
            "--interval",
            "1",
            "--spool-dir",
            str(tmp_path / "spool"),
            "--sysfs-root",
            str(tmp_path / "sys"),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
            "--retries",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    log.close()
    process.log = tmp_path / "agent.log"
    return process


def returns(stack, expr: str, *, finite: bool = False, seconds: float = 10.0) -> list[dict]:
    """The query's series once it has any (with a finite value, if ``finite``), within ``seconds``; [] if never."""

    def answered():
        result = stack.query(expr)
        if finite:
            result = [series for series in result if math.isfinite(float(series["value"][1]))]
        return result

    try:
        return wait_for(answered, seconds, 0.5, what=expr)
    except TimeoutError:
        return []


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def test_an_xid_through_prometheus_and_alertmanager_joins_the_agents_report_and_is_decided_once(
    tmp_path, tenant_a, stack_available
):
    from fleet.tasks import drift_sweep_task
    from tests.support.browser import SERVER_ENV
    from tests.support.processes import uvicorn_server

    cluster = protected_cluster(nodes=4, spares=2)
    job = submit(cluster, tenant_a, gpus=16, checkpoint_interval=10**9)
    node = JobAllocation.objects.filter(job=job, rank_start=0).get().node
    operator = make_user(Role.OPERATOR)
    _, scrape_token = services.token_create(actor=operator, owner=operator, name="prometheus", scope="read")
    _, webhook_token = services.token_create(
        actor=operator, owner=operator, name="alertmanager", scope="write"
    )
    _, agent_token = agent_token_create(actor=None, cluster=cluster, name="agents")
    agent_port = free_port()
    timings = monitoring.Timings(rule_windows={"10m": XID_WINDOW})

    with (
        uvicorn_server(tmp_path, **SERVER_ENV) as server,
        celery_worker(tmp_path, concurrency=1) as worker,
        beat_in_a_thread(cluster_ids=[cluster.pk]),
        monitoring.MonitoringStack(
            tmp_path / "monitoring",
            lockstep_url=server.url,
            scrape_token=scrape_token,
            webhook_token=webhook_token,
            gpu_targets=[(f"127.0.0.1:{agent_port}", node.hostname)],
            timings=timings,
        ) as stack,
    ):
        # The shipped configuration, with only the test's targets, token files and intervals changed, passes the
        # same checks as the shipped files.
        tools = monitoring.binaries()
        for command in (
            [tools["promtool"], "check", "config", str(stack.folder / "prometheus.yml")],
            [tools["amtool"], "check-config", str(stack.folder / "alertmanager.yml")],
        ):
            checked = monitoring.check(command)
            assert checked.returncode == 0, checked.stdout + checked.stderr

        # Prometheus scrapes Lockstep's /metrics with the read token before anything happens, so the dashboard's
        # rates see the decision happen.
        wait_for(
            lambda: [r for r in stack.query('up{job="lockstep"} == 1')],
            30,
            0.5,
            what=f"Prometheus to scrape Lockstep ({stack.targets()})",
        )
        drift_sweep_task.delay()  # a sweep through the worker: its duration reaches /metrics
        xid_at = time.time()
        agent = start_agent(
            tmp_path, url=server.url, token=agent_token, node=node.hostname, port=agent_port, xids=[[0, 79]]
        )
        try:

            def both_reported():
                fault = FaultEvent.objects.filter(node=node, kind="gpu_xid", xid=79).first()
                return fault if fault and {"agent", "alertmanager"} <= set(fault.sources) else None

            try:
                fault = wait_for(both_reported, 60, 0.3, what="both reports")
            except TimeoutError:
                pytest.fail(
                    f"the agent's and the alert's reports did not meet: faults "
                    f"{list(FaultEvent.objects.filter(node=node).values('kind', 'xid', 'sources'))}, "
                    f"alerts {stack.alerts()}\nagent: {agent.log.read_text()[-1500:]}\n"
                    f"alertmanager: {stack.output('alertmanager')[-1500:]}"
                )
            alert_seen = time.time() - xid_at
            settled = wait_for(
                lambda: (
                    RecoveryAction.objects.filter(job=job, state=ActionState.SUCCEEDED).exists()
                    and not RecoveryAction.objects.filter(
                        job=job, state__in=(ActionState.PLANNED, ActionState.RUNNING)
                    ).exists()
                ),
                60,
                0.3,
                what="the recovery to finish",
            )
            assert settled

            # The alert is the same fault as the agent's report: one fault, one incident, one decision.
            record = AlertRecord.objects.get(fault=fault)
            assert record.alertname == "GPUXidError" and record.status == "firing"
            assert record.labels["Hostname"] == node.hostname and record.labels["gpu"] == "0"
            assert record.labels["xid"] == "79" and record.labels["lockstep_kind"] == "gpu_xid"
            assert (
                record.labels["UUID"].startswith("GPU-")
                and record.labels["modelName"] == "NVIDIA H100 80GB HBM3"
            )
            assert FaultEvent.objects.filter(node=node).count() == 1
            assert Incident.objects.filter(node=node).count() == 1
            fault.refresh_from_db()
            assert fault.state == "handled" and fault.incident_id == Incident.objects.get(node=node).pk
            actions = list(RecoveryAction.objects.filter(job=job))
            assert len(actions) == 1, [(a.kind, a.state) for a in actions]
            action = actions[0]
            assert action.fault_id == fault.pk and action.gpu_hours_baseline > 0

            # The code stands for the rule's window: the alert resolves, and Lockstep records it on the fault; the
            # recovery is not undone.
            wait_for(
                lambda: AlertRecord.objects.get(pk=record.pk).status == "resolved",
                60,
                0.5,
                what="the resolved alert",
            )
            fault.refresh_from_db()
            assert "alert_resolved_at" in fault.details
            action.refresh_from_db()
            job.refresh_from_db()
            assert action.state == ActionState.SUCCEEDED and job.state == JobState.RUNNING
            assert RecoveryAction.objects.filter(job=job).count() == 1
            assert node.pk not in set(
                JobAllocation.objects.filter(job=job, released_at__isnull=True).values_list(
                    "node_id", flat=True
                )
            )

            # Lockstep's own figures: the sweep the worker ran, and every shipped rule evaluates without error.
            wait_for(
                lambda: stack.query('lockstep_sweep_duration_seconds{task="fleet.drift_sweep"}'),
                30,
                0.5,
                what="the drift sweep's duration in Prometheus",
            )
            assert returns(stack, 'lockstep_heartbeats{role="worker"} >= 1')
            # Alertmanager delivered to the webhook (firing and resolved) and never failed to.
            assert returns(stack, 'alertmanager_notifications_total{integration="webhook"} >= 2')
            assert returns(stack, 'alertmanager_notifications_failed_total{integration="webhook"} == 0')
            rules = stack.rules()
            assert len(rules) >= 19
            assert all(rule["health"] == "ok" for rule in rules), [
                (rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"
            ]

            # What Prometheus read from Lockstep is this test's story: one Xid fault, one successful recovery. (Each
            # query is retried for a few seconds: one scrape that failed on this loaded machine marks Lockstep's
            # series stale until the next.)
            assert returns(stack, 'sum(lockstep_faults_total{kind="gpu_xid"}) == 1')
            # Prometheus holds what the database holds (every action that succeeded: the job's and the node's own).
            succeeded = RecoveryAction.objects.filter(state=ActionState.SUCCEEDED).count()
            assert returns(
                stack, f'sum(lockstep_recovery_actions_total{{outcome="succeeded"}}) == {succeeded}'
            )
            assert returns(
                stack, f'lockstep_recovery_actions_total{{kind="{action.kind}",outcome="succeeded"}} >= 1'
            )

            # Every query of the shipped dashboard returns a series with a number in it (the fault-to-decision
            # quantiles are numbers only if Prometheus saw the decision happen).
            empty = []
            for title, expr in dashboard_queries():
                result = returns(stack, expr, finite=True)
                if not result:
                    empty.append((title, expr, stack.query(expr)))
            assert not empty, empty
        finally:
            stop_group(agent, 10)
        log = worker.log.read_text()
    assert "Traceback" not in log, log[-3000:]
    print(
        f"Xid 79 to both reports merged: {alert_seen:.1f} s (scrape and evaluation every "
        f"{timings.scrape_interval}, group_wait {timings.group_wait})"
    )
