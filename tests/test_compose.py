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


@pytest.mark.parametrize("name", ["postgres", "redis", *APP_SERVICES])
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
