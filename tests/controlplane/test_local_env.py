"""A local run's settings file (var/local.env): every process of the checkout reads it, the environment wins over
it, and a process that brings its own SECRET_KEY (production, CI, this suite) never reads it."""

import os
import stat
import subprocess
import sys

from django.conf import settings

from controlplane.settings import local_env_file
from tests.support.processes import BASE_DIR

SHOW = (
    "import json, django; from django.conf import settings; django.setup(); print(json.dumps({name: "
    "str(getattr(settings, name)) for name in ('DEBUG', 'SECRET_KEY', 'EVENT_RETENTION_DAYS', "
    "'TELEMETRY_RAW_RETENTION_HOURS', 'LOCAL_ENV_FILE')}))"
)


def settings_of(**env: str) -> dict:
    """The settings a fresh process of this checkout gets with only ``env`` in its environment."""
    import json

    answer = subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "REDIS_URL": settings.REDIS_URL,
            "DATABASE_URL": "sqlite:///:memory:",
            **env,
        },
    )
    assert answer.returncode == 0, answer.stderr[-2000:]
    return json.loads(answer.stdout)


def write_local_env(tmp_path) -> tuple:
    path = tmp_path / "local.env"
    made = subprocess.run(
        [sys.executable, "bin/local-env", str(path)], cwd=BASE_DIR, capture_output=True, text=True, timeout=30
    )
    assert made.returncode == 0 and made.stdout.strip() == str(path), made.stderr
    key = next(
        line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith("SECRET_KEY=")
    )
    return path, key


def test_make_runs_file_is_private_holds_a_new_key_and_is_written_once(tmp_path):
    path, key = write_local_env(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 50
    assert "DEBUG=true" in path.read_text().splitlines()
    assert write_local_env(tmp_path) == (path, key)  # a second `make run` keeps the key
    assert write_local_env(tmp_path / "other")[1] != key


def test_a_process_without_its_own_key_reads_the_file_and_the_environment_wins(tmp_path):
    path, key = write_local_env(tmp_path)
    read = settings_of(LOCAL_ENV_FILE=str(path))
    # The file's key and DEBUG (no ImproperlyConfigured for a missing key), its demo retention.
    assert read["SECRET_KEY"] == key and read["DEBUG"] == "True" and read["LOCAL_ENV_FILE"] == str(path)
    assert float(read["TELEMETRY_RAW_RETENTION_HOURS"]) < 1 and float(read["EVENT_RETENTION_DAYS"]) < 1
    won = settings_of(LOCAL_ENV_FILE=str(path), EVENT_RETENTION_DAYS="3", DEBUG="false", PLAIN_HTTP="true")
    assert won["EVENT_RETENTION_DAYS"] == "3.0" and won["DEBUG"] == "False" and won["SECRET_KEY"] == key


def test_a_process_that_brings_its_own_key_ignores_the_file(tmp_path):
    path, key = write_local_env(tmp_path)
    own = "k" * 40
    read = settings_of(LOCAL_ENV_FILE=str(path), SECRET_KEY=own, PLAIN_HTTP="true")
    assert read["SECRET_KEY"] == own and read["DEBUG"] == "False" and read["LOCAL_ENV_FILE"] == "None"
    assert read["EVENT_RETENTION_DAYS"] == "7.0"
    # Without a key and without the file, production refuses to start, as before.
    refused = subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "LOCAL_ENV_FILE": "",
        },
    )
    assert refused.returncode != 0 and "SECRET_KEY must be set" in refused.stderr


def test_the_test_suite_never_reads_a_local_env(tmp_path):
    path, _ = write_local_env(tmp_path)
    assert settings.LOCAL_ENV_FILE is None and not settings.DEBUG
    assert os.environ.get("SECRET_KEY")  # set by controlplane/testing/settings.py, and inherited by children
    assert local_env_file({**os.environ, "LOCAL_ENV_FILE": str(path)}) is None
    assert local_env_file({"LOCAL_ENV_FILE": str(path)}) == path
    assert local_env_file({"LOCAL_ENV_FILE": ""}) is None
    assert local_env_file({"LOCAL_ENV_FILE": str(tmp_path / "missing.env")}) is None
