"""The embedded default: migrate a fresh SQLite file and serve the login page through uvicorn."""

import sqlite3
import subprocess
import sys

import requests
from django.conf import settings

from tests.support.processes import BASE_DIR, free_port, wait_for


def test_sqlite_migrates_and_serves_login(tmp_path):
    database = tmp_path / "lockstep.sqlite3"
    env = {
        "PATH": f"{BASE_DIR / '.venv' / 'bin'}:/usr/bin:/bin",
        "DATABASE_URL": f"sqlite:///{database}",
        "REDIS_URL": settings.REDIS_URL,  # the suite's (this xdist worker's) Redis database
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DEBUG": "true",
    }  # as `make run` does: no SECRET_KEY, plain http
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    admin = subprocess.run(
        [sys.executable, "manage.py", "ensure_demo_admin"],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "password" in admin.stdout
    assert sqlite3.connect(database).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--port", str(port)],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        page = wait_for(
            lambda: requests.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2), 30, what="uvicorn"
        )
        assert page.status_code == 200 and "Log in to Lockstep" in page.text
        home = requests.get(f"http://127.0.0.1:{port}/", timeout=5, allow_redirects=False)
        assert home.status_code == 302 and "/accounts/login/" in home.headers["Location"]
    finally:
        server.terminate()
        server.wait(10)
