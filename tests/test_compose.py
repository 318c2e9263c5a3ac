"""The deployment files agree with the settings: docker-compose.yml, the Dockerfile and the README's table.

Plain file checks; no database, no Docker.
"""

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
APP_SERVICES = ("web", "worker", "beat")
MONITORING_SERVICES = ("prometheus", "alertmanager", "grafana", "monitoring-tokens")
TOKENS_AT = "/run/lockstep"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def command_text(service: dict) -> str:
    command = service.get("command", "")
    if isinstance(command, list):
        command = shlex.join(command)
    return " ".join(command.split())


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(name): "" if value is None else str(value) for name, value in env.items()}


def depends_on(service: dict) -> dict[str, str]:
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):  # the short form only waits for the container to start
        return {name: "service_started" for name in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def test_services_exist(compose):
    assert {"postgres", "redis", *APP_SERVICES} <= set(compose["services"])


@pytest.mark.parametrize("name", ["postgres", "redis", *APP_SERVICES, *MONITORING_SERVICES])
def test_every_service_has_a_healthcheck(compose, name):
    healthcheck = compose["services"][name].get("healthcheck") or {}
    test = healthcheck.get("test")
    assert test, f"{name} has no healthcheck test"
    if isinstance(test, list):
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1 and all(test[1:]), test
    else:
        assert test.strip()


def test_web_runs_uvicorn(compose):
    assert "uvicorn controlplane.asgi:application" in command_text(compose["services"]["web"])


def test_web_is_published_on_8000(compose):
    assert any(str(port).endswith("8000:8000") for port in compose["services"]["web"].get("ports", []))


def test_worker_runs_celery_worker(compose):
    assert "celery -A controlplane worker" in command_text(compose["services"]["worker"])


def test_beat_runs_celery_beat(compose):
    assert "celery -A controlplane beat" in command_text(compose["services"]["beat"])


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_wait_for_healthy_postgres_and_redis(compose, name):
    deps = depends_on(compose["services"][name])
    assert deps.get("postgres") == "service_healthy"
    assert deps.get("redis") == "service_healthy"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_environment_is_declared_in_settings(compose, name):
    env = environment(compose["services"][name])
    assert env, f"{name} sets no environment"
    unknown = sorted(set(env) - set(settings.ENVIRONMENT))
    assert not unknown, f"{name} sets variables settings.ENVIRONMENT does not declare: {unknown}"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_reach_the_compose_postgres_and_redis(compose, name):
    env = environment(compose["services"][name])
    database = urlsplit(env["DATABASE_URL"])
    assert database.scheme in ("postgres", "postgresql", "pgsql")
    assert database.hostname == "postgres"
    redis_url = urlsplit(env["REDIS_URL"])
    assert redis_url.scheme == "redis"
    assert redis_url.hostname == "redis"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_run_without_debug(compose, name):
    assert environment(compose["services"][name]).get("DEBUG", "false").lower() in ("false", "0", "no", "off")


def test_dockerfile_starts_uvicorn():
    dockerfile = ROOT / "Dockerfile"
    assert dockerfile.exists()
    starts = [
        line
        for line in dockerfile.read_text().splitlines()
        if line.strip().upper().startswith(("CMD", "ENTRYPOINT"))
    ]
    assert starts, "the Dockerfile has no CMD or ENTRYPOINT"
    assert any("uvicorn" in line for line in starts), starts


def test_readme_configuration_table_lists_every_setting():
    readme = ROOT / "README.md"
    assert readme.exists(), "README.md is missing; its configuration table must list every ENVIRONMENT key"
    table_rows = [line for line in readme.read_text().splitlines() if line.lstrip().startswith("|")]
    named = set()
    for row in table_rows:
        named.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", row))
    missing = sorted(set(settings.ENVIRONMENT) - named)
    assert not missing, f"README.md's configuration table does not list: {missing}"


# --- the monitoring stack: Prometheus, Alertmanager and Grafana on the shipped configuration (deploy/) ----------------


def mounts(service: dict) -> dict[str, str]:
    """Container path -> source (a path relative to the repository, or a volume name)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        found[target] = source
    return found


def flag(service: dict, name: str) -> str:
    return next(part.split("=", 1)[1] for part in service["command"] if part.startswith(f"--{name}="))


def repository_file(service: dict, container_path: str) -> Path:
    """The repository file a container path of ``service`` is, through its bind mounts."""
    for target, source in sorted(mounts(service).items(), key=lambda item: -len(item[0])):
        if source.startswith("./") and (container_path == target or container_path.startswith(target + "/")):
            return ROOT / source[2:] / container_path[len(target) :].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted from the repository")


def test_monitoring_services_exist(compose):
    assert set(MONITORING_SERVICES) <= set(compose["services"])
    assert {"monitoring-tokens", "prometheus-data", "alertmanager-data", "grafana-data"} <= set(
        compose["volumes"]
    )


@pytest.mark.parametrize(
    "name, config_flag", [("prometheus", "config.file"), ("alertmanager", "config.file")]
)
def test_prometheus_and_alertmanager_run_the_shipped_files(compose, name, config_flag):
    service = compose["services"][name]
    config = repository_file(service, flag(service, config_flag))
    assert config.is_file() and config.is_relative_to(ROOT / "deploy"), config
    assert mounts(service)[TOKENS_AT] == "monitoring-tokens"
    # Every token file the configuration reads is one the token service writes, in the volume both mount.
    text = config.read_text()
    wanted = set(re.findall(r"credentials_file:\s*(\S+)", text))
    assert wanted, f"{config} reads no token file"
    writer = compose["services"]["monitoring-tokens"]
    assert mounts(writer)[TOKENS_AT] == "monitoring-tokens"
    for path in wanted:
        assert path.startswith(TOKENS_AT + "/") and f"> {path}" in command_text(writer), path
    assert depends_on(service)["monitoring-tokens"] == "service_completed_successfully"


def test_the_token_service_makes_a_read_token_for_prometheus_and_a_write_token_for_alertmanager(compose):
    command = command_text(compose["services"]["monitoring-tokens"])
    assert re.search(
        r"createtoken \S+ --scope read --name prometheus > /run/lockstep/prometheus-token", command
    ), command
    assert re.search(
        r"createtoken \S+ --scope write --name alertmanager > /run/lockstep/alertmanager-token", command
    )
    env = environment(compose["services"]["monitoring-tokens"])
    assert not sorted(set(env) - set(settings.ENVIRONMENT))
    assert depends_on(compose["services"]["monitoring-tokens"])["web"] == "service_healthy"


def test_prometheus_scrapes_lockstep_and_alertmanager_posts_to_it_on_the_compose_network(compose):
    prometheus = yaml.safe_load(
        repository_file(compose["services"]["prometheus"], "/etc/prometheus/prometheus.yml").read_text()
    )
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    web_port = compose["services"]["web"]["ports"][0].split(":")[-1]
    assert jobs["lockstep"]["static_configs"][0]["targets"] == [f"web:{web_port}"]
    assert prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    alertmanager = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    webhook = next(r for r in alertmanager["receivers"] if r["name"] == "lockstep")["webhook_configs"][0]
    assert urlsplit(webhook["url"]).netloc == f"web:{web_port}"
    assert "web" in environment(compose["services"]["web"])["ALLOWED_HOSTS"].split(",")


def test_compose_pins_the_versions_the_tests_run(compose):
    """tests/monitoring runs Debian's prometheus 2.42 and prometheus-alertmanager 0.25."""
    assert re.fullmatch(r"prom/prometheus:v2\.42\.\d+", compose["services"]["prometheus"]["image"])
    assert re.fullmatch(r"prom/alertmanager:v0\.25\.\d+", compose["services"]["alertmanager"]["image"])


def test_grafana_is_provisioned_with_prometheus_and_the_shipped_dashboard(compose):
    grafana = compose["services"]["grafana"]
    provisioning = repository_file(grafana, "/etc/grafana/provisioning")
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [(s["type"], s["url"], s["isDefault"]) for s in sources] == [
        ("prometheus", "http://prometheus:9090", True)
    ]
    providers = yaml.safe_load((provisioning / "dashboards" / "lockstep.yml").read_text())["providers"]
    folder = providers[0]["options"]["path"]
    dashboards = [target for target in mounts(grafana) if target.startswith(folder + "/")]
    assert dashboards and repository_file(grafana, dashboards[0]) == ROOT / "docs" / "grafana-lockstep.json"
    import json

    dashboard = json.loads((ROOT / "docs" / "grafana-lockstep.json").read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["type"] == "datasource")
    assert variable["query"] == "prometheus"  # the panels' ${datasource} resolves to the provisioned one
    assert depends_on(grafana)["prometheus"] == "service_healthy"
