"""`manage.py` from a second terminal beside `make run`: it reads var/local.env (no SECRET_KEY, no DEBUG in its
environment) and prints only its own output on stdout, so `$(manage.py createtoken …)` is the token."""

import os
import subprocess
import sys

import pytest
from django.conf import settings

from fleet.choices import DriverName
from tenancy.authentication import user_for_bearer
from tenancy.choices import Role
from tests.support.factories import make_cluster, make_node, make_user
from tests.support.processes import BASE_DIR, database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def second_terminal(tmp_path):
    """The environment of a shell that only has the checkout: its settings come from the local env file."""
    path = tmp_path / "local.env"
    subprocess.run(
        [sys.executable, "bin/local-env", str(path)], cwd=BASE_DIR, check=True, capture_output=True
    )
    # The server here is this test process: the file carries its key, as `make run`'s processes share the file's
    # (cluster credentials are encrypted with keys derived from it, and another key could not read them).
    lines = [
        f"SECRET_KEY={settings.SECRET_KEY}" if line.startswith("SECRET_KEY=") else line
        for line in path.read_text().splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    # The test database stands in for the file's SQLite path (the environment wins over the file).
    return {
        "PATH": os.environ["PATH"],
        "LOCAL_ENV_FILE": str(path),
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
    }


def manage(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_createtoken_prints_only_the_token(second_terminal):
    user = make_user(Role.OPERATOR, username="cli-operator")
    answer = manage(second_terminal, "createtoken", "cli-operator", "--scope", "write")
    assert answer.returncode == 0, answer.stderr[-2000:]
    assert answer.stdout.count("\n") == 1 and answer.stdout.split()[-1].startswith("lsk_"), answer.stdout
    assert user_for_bearer(answer.stdout.split()[-1])[0] == user


def test_createagenttoken_and_simulate_drift_print_only_their_answer(second_terminal):
    cluster = make_cluster(name="cli-sim", driver=DriverName.SIMULATED)
    make_node(cluster, "cli-sim-n0")
    token = manage(second_terminal, "createagenttoken", "cli-sim")
    assert token.returncode == 0, token.stderr[-2000:]
    assert token.stdout.count("\n") == 1 and token.stdout.split()[-1].startswith("lsa_"), token.stdout
    extra = manage(
        second_terminal,
        "simulate",
        "drift",
        "--cluster",
        "cli-sim",
        "--kind",
        "extra",
        "--addon",
        "x",
        "--version",
        "1.0.0",
    )
    assert extra.returncode == 0, extra.stderr[-2000:]
    assert extra.stdout.count("\n") == 1 and "cli-sim" in extra.stdout, extra.stdout


def test_an_unknown_user_is_an_error_on_stderr_and_nothing_on_stdout(second_terminal):
    answer = manage(second_terminal, "createtoken", "nobody-here")
    assert answer.returncode != 0 and answer.stdout == "" and "nobody-here" in answer.stderr
