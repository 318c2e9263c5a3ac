"""The shipped Prometheus and Alertmanager files (deploy/) pass promtool and amtool, and agree with Lockstep: the
rules' fault kinds are ones Lockstep files, their metrics are ones /metrics and the agent serve, and Alertmanager
sends exactly the GPU and node alerts to Lockstep's webhook."""

import re
from pathlib import Path

import pytest
import yaml

from jobs.choices import FaultKind
from telemetry.alertmanager import map_alert
from tests.support import monitoring

DEPLOY = monitoring.DEPLOY
TOOLS = monitoring.binaries()


def needs(tool: str):
    return pytest.mark.skipif(TOOLS[tool] is None, reason=monitoring.available())


def run(*command, stdout_only: bool = False) -> str:
    done = monitoring.check([str(part) for part in command])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout if stdout_only else done.stdout + done.stderr


def rules() -> list[dict]:
    found = []
    for path in monitoring.RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.extend({**rule, "file": path.name} for rule in group["rules"])
    return found


def test_every_prometheus_and_alertmanager_file_is_one_the_tools_check():
    """promtool checks the config (and through it the file_sd targets), the rules and their unit tests; amtool the
    Alertmanager config. A file in these folders that none of them reads would go unchecked."""
    checked = {
        monitoring.PROMETHEUS_CONFIG,
        *monitoring.RULE_FILES,
        *monitoring.RULE_TESTS,
        DEPLOY / "prometheus" / "targets" / "gpu-nodes.yml",
        monitoring.ALERTMANAGER_CONFIG,
    }
    present = {*(DEPLOY / "prometheus").rglob("*.y*ml"), *(DEPLOY / "alertmanager").rglob("*.y*ml")}
    assert present == checked, present ^ checked
    assert len(monitoring.RULE_FILES) == 2 and len(monitoring.RULE_TESTS) == 2
    # The config names every rule file there is, and nothing else.
    config = yaml.safe_load(monitoring.PROMETHEUS_CONFIG.read_text())
    assert sorted(config["rule_files"]) == sorted(f"rules/{p.name}" for p in monitoring.RULE_FILES)


@needs("promtool")
def test_prometheus_config_passes_promtool(tmp_path):
    # The shipped file as it stands (its token file exists only where it is deployed) ...
    run(TOOLS["promtool"], "check", "config", "--syntax-only", monitoring.PROMETHEUS_CONFIG)
    # ... and in full, rule files and file_sd targets included, with only the token file's path pointed at one.
    copy = tmp_path / "prometheus"
    copy.mkdir()
    token = tmp_path / "token"
    token.write_text("lsk_not_a_real_token")
    text = monitoring.PROMETHEUS_CONFIG.read_text()
    assert text.count("/run/lockstep/prometheus-token") == 1
    (copy / "prometheus.yml").write_text(text.replace("/run/lockstep/prometheus-token", str(token)))
    for folder in ("rules", "targets"):
        (copy / folder).symlink_to(DEPLOY / "prometheus" / folder)
    out = run(TOOLS["promtool"], "check", "config", copy / "prometheus.yml")
    assert out.count("SUCCESS") >= 3, out  # the config and both rule files


@needs("promtool")
def test_rule_files_pass_promtool_and_their_unit_tests():
    out = run(TOOLS["promtool"], "check", "rules", *monitoring.RULE_FILES)
    assert out.count("SUCCESS") == len(monitoring.RULE_FILES)
    run(TOOLS["promtool"], "test", "rules", *monitoring.RULE_TESTS)


@needs("amtool")
def test_alertmanager_config_passes_amtool():
    run(TOOLS["amtool"], "check-config", monitoring.ALERTMANAGER_CONFIG)


@needs("amtool")
@pytest.mark.parametrize(
    "labels, receivers",
    [
        (["alertname=GPUXidError", "lockstep_kind=gpu_xid", "Hostname=n1"], "lockstep,platform-team"),
        (["alertname=GPUNodeDown", "lockstep_kind=node_unreachable", "node=n1"], "lockstep,platform-team"),
        (["alertname=LockstepNoWorker", "component=lockstep"], "platform-team"),
    ],
)
def test_alertmanager_sends_gpu_and_node_alerts_to_lockstep_and_its_own_health_to_people(labels, receivers):
    out = run(
        TOOLS["amtool"],
        "config",
        "routes",
        "test",
        f"--config.file={monitoring.ALERTMANAGER_CONFIG}",
        *labels,
        stdout_only=True,
    )
    assert out.strip() == receivers


def test_alertmanager_posts_to_the_webhook_with_credentials_from_a_file():
    config = yaml.safe_load(monitoring.ALERTMANAGER_CONFIG.read_text())
    webhook = next(r for r in config["receivers"] if r["name"] == "lockstep")["webhook_configs"][0]
    assert webhook["url"].endswith("/api/v1/ingest/alertmanager/") and webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"]["credentials_file"]
    assert webhook["max_alerts"] <= 1000  # telemetry/services/alerts.py MAX_ALERTS


def test_prometheus_scrapes_lockstep_with_a_bearer_token_file():
    jobs = {
        job["job_name"]: job
        for job in yaml.safe_load(monitoring.PROMETHEUS_CONFIG.read_text())["scrape_configs"]
    }
    lockstep = jobs["lockstep"]
    assert lockstep["metrics_path"] == "/metrics"
    assert lockstep["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/run/lockstep/prometheus-token",
    }
    assert "gpu-nodes" in jobs


@pytest.mark.parametrize(
    "rule", [r for r in rules() if "lockstep_kind" in r.get("labels", {})], ids=lambda r: r["alert"]
)
def test_gpu_and_node_rules_become_the_fault_they_name(rule):
    """What Lockstep makes of the alert each rule raises, with the labels its series carry."""
    kind = rule["labels"]["lockstep_kind"]
    assert kind in FaultKind.values
    labels = {
        "alertname": rule["alert"],
        **rule["labels"],
        "gpu": "0",
        "UUID": "GPU-x",
        "modelName": "H100",
        "instance": "n1:9400",
        "job": "gpu-nodes",
    }
    if "up{" in rule["expr"]:
        labels = {k: v for k, v in labels.items() if k not in ("gpu", "UUID", "modelName")} | {"node": "n1"}
    else:
        labels["Hostname"] = "n1"
    if kind == "gpu_xid":
        labels["xid"] = "79"
    mapped = map_alert(
        {
            "fingerprint": "f1",
            "status": "firing",
            "labels": labels,
            "annotations": {},
            "startsAt": "2026-12-01T10:00:00Z",
        }
    )
    assert not mapped.problem and mapped.kind == kind and mapped.hostname == "n1"
    assert mapped.xid == (79 if kind == "gpu_xid" else None)


def test_lockstep_health_rules_never_go_to_the_webhook():
    health = [r for r in rules() if r["file"] == "lockstep.rules.yml"]
    assert len(health) >= 10
    assert all(
        r["labels"].get("component") == "lockstep" and "lockstep_kind" not in r["labels"] for r in health
    )
    covered = " ".join(r["expr"] for r in health)
    for metric in (
        "lockstep_faults_waiting_oldest_seconds",
        "lockstep_outbox_oldest_unsent_seconds",
        "lockstep_queue_depth",
        'lockstep_heartbeats{role="worker"}',
        'lockstep_heartbeats{role="beat"}',
        'lockstep_sweep_duration_seconds{task="fleet.drift_sweep"}',
    ):
        assert metric in covered, metric


@pytest.mark.django_db
def test_every_lockstep_metric_the_rules_read_is_exposed(api, users):
    api.as_token(users["operator"], "read")
    text = api.get("/metrics").content.decode()
    exposed = {line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE")}
    series = set()
    for name in exposed:
        series |= {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    used = set()
    for rule in rules():
        used |= set(re.findall(r"\blockstep_[a-z_]+", rule["expr"]))
    assert used and used <= series, used - series


def test_every_dcgm_metric_the_rules_read_is_served_by_the_agent():
    from lockstep_agent import gpu

    source = Path(gpu.__file__).read_text()
    used = set()
    for rule in rules():
        used |= set(re.findall(r"\bDCGM_FI_[A-Z_]+", rule["expr"]))
    assert used and all(f'"{name}"' in source for name in used), sorted(
        n for n in used if f'"{n}"' not in source
    )
