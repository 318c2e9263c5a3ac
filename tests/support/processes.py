"""Real processes for tests: a private redis-server, a private PostgreSQL, a uvicorn server, a Celery worker and
a Celery beat.

They run against the test database (which must be committed: use ``transactional_db``) and the test Redis, or
against a private server the test may stop and start (``PrivateRedis``, ``PrivatePostgres``).
"""

import glob
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection, connections

from tests.support.slack import SLACK

BASE_DIR = Path(settings.BASE_DIR)
VENV_BIN = Path(sys.executable).parent


def manage_py(*args: str, env: dict) -> subprocess.CompletedProcess:
    """``manage.py ARGS`` in a process of its own with exactly ``env``: what a process started so does or refuses."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it answers truthy; ``timeout`` is a quiet machine's figure, stretched by SLACK."""
    deadline = time.monotonic() + timeout * SLACK
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as error:  # not up yet
            last = error
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} ({timeout * SLACK:.0f} s; last: {last!r})")


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
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: redis.Redis(port=self.port, socket_timeout=0.5).ping(), 10, what="private redis")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class PrivatePostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, or no user to run them as."""


def _postgres_bindir() -> Path | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/<n>/bin, else initdb on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """A PostgreSQL server of the test's own: ``initdb`` into a temporary directory, ``pg_ctl start`` on a spare
    port, so the test may stop and start it while the suite's own database stays up.

    PostgreSQL refuses to run as root; under root the server runs as the ``postgres`` user (``runuser``), and
    its directory belongs to that user. Raises PrivatePostgresUnavailable when neither works here. Durability is
    off (fsync, full-page writes): the data is thrown away with the directory.
    """

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.bindir = _postgres_bindir()
        if self.bindir is None:
            raise PrivatePostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) found")
        self.owner: int | None = None
        self.runuser: str | None = None
        if os.geteuid() == 0:
            try:
                self.owner = pwd.getpwnam("postgres").pw_uid
            except KeyError as error:
                raise PrivatePostgresUnavailable(
                    "running as root and there is no postgres user to run as"
                ) from error
            self.runuser = shutil.which("runuser") or shutil.which("su")
            if self.runuser is None:
                raise PrivatePostgresUnavailable("running as root and neither runuser nor su is installed")
        self.directory: Path | None = None
        self.started = False

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    def url(self, name: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.runuser and self.runuser.endswith("runuser"):
            command = [self.runuser, "-u", "postgres", "--", *command]
        elif self.runuser:
            command = [self.runuser, "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=self.directory)
        if result.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({result.returncode}): {result.stdout[-800:]} "
                f"{result.stderr[-800:]} {self.output()[-800:]}"
            )
        return result

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.directory and self.log.exists() else ""

    def start(self) -> "PrivatePostgres":
        """The first start creates the cluster (initdb); later starts reopen it. Returns once it accepts
        connections."""
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="lockstep-pg-"))
            if self.owner is not None:
                os.chown(self.directory, self.owner, -1)
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            )
        options = (
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c synchronous_commit=off -c max_connections=200"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start"
        )
        self.started = True
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop``: fast (roll back open transactions, end every session) or immediate (a crash)."""
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
            self.started = False

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def migrate(self, name: str) -> None:
        """``manage.py migrate`` into one of its databases, in a child process as production runs it."""
        result = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=BASE_DIR,
            env=child_env(DATABASE_URL=self.url(name)),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise RuntimeError(f"migrate failed: {result.stdout[-2000:]} {result.stderr[-2000:]}")

    @contextmanager
    def use(self, name: str):
        """Point this process's ORM (every thread's ``default`` connection) and the processes it starts
        (``child_env``) at one of its databases, and back at the suite's database afterwards."""
        from django.contrib.contenttypes.models import ContentType

        default = connections["default"]
        saved = dict(default.settings_dict)

        def let_go():
            try:
                default.close()
                if default.settings_dict.get("OPTIONS", {}).get("pool"):
                    default.close_pool()  # a pool keeps connections to the server it was opened on
            except Exception:  # the server may be down: its connections are gone either way
                pass

        let_go()
        # Every thread's connection object shares this dict, so new connections in any thread go there too.
        default.settings_dict.update(
            NAME=name, HOST="127.0.0.1", PORT=str(self.port), USER="postgres", PASSWORD=""
        )
        ContentType.objects.clear_cache()
        try:
            yield self.url(name)
        finally:
            let_go()
            default.settings_dict.clear()
            default.settings_dict.update(saved)
            ContentType.objects.clear_cache()


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


def kill_group(process: subprocess.Popen, sig: int = signal.SIGKILL, timeout: float = 15) -> float:
    """Send ``sig`` to a process started in a session of its own, children included, and wait for it to exit;
    returns the time (epoch seconds) it was sent."""
    os.killpg(process.pid, sig)
    process.wait(timeout)
    return time.time()


def lock_waiters() -> int:
    """Sessions of the test database waiting for a lock right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def stop_group(process: subprocess.Popen, timeout: float = 20) -> None:
    """End a process started in a session of its own, children included: SIGTERM to its process group, then
    SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


@contextmanager
def uvicorn_server(tmp_path: Path, **env):
    import requests

    port = free_port()
    log = tmp_path / f"uvicorn-{port}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(VENV_BIN / "uvicorn"),
                "controlplane.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=BASE_DIR,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server(process, port, log)
    try:
        wait_for(
            lambda: requests.get(f"{server.url}/healthz", timeout=5).ok,
            30,
            what=f"uvicorn ({server.output()[-500:]})",
        )
        yield server
    finally:
        _stop(process)


@contextmanager
def celery_worker(tmp_path: Path, *, concurrency: int = 1, queues: str | None = None, **env):
    """A real `celery -A controlplane worker` (prefork) that the test can SIGKILL; yields the Popen. ``queues``
    (comma-separated) is its -Q; None: no -Q, every declared queue, as a small deployment's one worker runs."""
    name = f"test-{free_port()}"
    log = tmp_path / f"celery-{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(VENV_BIN / "celery"),
                "-A",
                "controlplane",
                "worker",
                "--loglevel=info",
                f"--concurrency={concurrency}",
                "-n",
                f"{name}@%h",
                *(["-Q", queues] if queues else []),
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=BASE_DIR,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    process.node_name = name
    try:
        client = redis.Redis.from_url(settings.REDIS_URL)
        wait_for(
            lambda: any(name in key.decode() for key in client.scan_iter("lockstep:heartbeat:worker:*")),
            60,
            what=f"celery worker ({log.read_text()[-800:] if log.exists() else ''})",
        )
        yield process
    finally:
        stop_group(process)


@contextmanager
def celery_beat(tmp_path: Path, name: str = "beat", **env):
    """A real `celery -A controlplane beat` in its own process group, with its own schedule file; yields the
    Popen (``.log`` is its output)."""
    log = tmp_path / f"beat-{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                str(VENV_BIN / "celery"),
                "-A",
                "controlplane",
                "beat",
                "--loglevel=info",
                "--schedule",
                str(tmp_path / f"beat-{name}-schedule"),
            ],
            cwd=BASE_DIR,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    try:
        yield process
    finally:
        stop_group(process, 15)
