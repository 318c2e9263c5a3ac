"""Real processes for tests: a private redis-server, a uvicorn server and a Celery worker.

They run against the test database (which must be committed: use ``transactional_db``) and the test Redis.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

BASE_DIR = Path(settings.BASE_DIR)
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:  # not up yet
            last = error
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} (last: {last!r})")


def database_url() -> str:
    """A URL for the database the tests use right now (the test database pytest-django created)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class PrivateRedis:
    """A redis-server of the test's own on a spare port, that the test may stop and start again."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "PrivateRedis":
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: redis.Redis(port=self.port, socket_timeout=0.5).ping(), 10, what="private redis")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class Server:
    def __init__(self, process: subprocess.Popen, port: int, log: Path):
        self.process, self.port, self.log = process, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _stop(process: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 15) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@contextmanager
def uvicorn_server(tmp_path: Path, **env):
    import requests

    port = free_port()
    log = tmp_path / f"uvicorn-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(VENV_BIN / "uvicorn"), "controlplane.asgi:application", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"],
            cwd=BASE_DIR, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT,
        )
    server = Server(process, port, log)
    try:
        wait_for(lambda: requests.get(f"{server.url}/healthz", timeout=1).ok, 30, what=f"uvicorn ({server.output()[-500:]})")
        yield server
    finally:
        _stop(process)


@contextmanager
def celery_worker(tmp_path: Path, *, concurrency: int = 1, queues: str = "celery", **env):
    """A real `celery -A controlplane worker` (prefork) that the test can SIGKILL; yields the Popen."""
    name = f"test-{free_port()}"
    log = tmp_path / f"celery-{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "controlplane", "worker", "--loglevel=info", f"--concurrency={concurrency}",
             "-n", f"{name}@%h", "-Q", queues, "--without-gossip", "--without-mingle"],
            cwd=BASE_DIR, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    process.node_name = name
    try:
        client = redis.Redis.from_url(settings.REDIS_URL)
        wait_for(lambda: any(name in key.decode() for key in client.scan_iter("lockstep:heartbeat:worker:*")), 60,
                 what=f"celery worker ({log.read_text()[-800:] if log.exists() else ''})")
        yield process
    finally:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)
