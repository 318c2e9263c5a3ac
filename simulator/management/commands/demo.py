"""``manage.py demo start``: the demo's users and world, then a box that says how to log in.

`make run` runs it (Procfile, ``simulator``) before the simulator: it creates the demo admin and the demo world
when missing, waits until web, a worker and beat answer, and prints the demo's users in a box with the passwords
made just now and the command that sets a new one. Passwords are kept nowhere: a later start lists the users
and says how to set a new password. The box goes to stdout, anything else to stderr.
"""

import time

import redis
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db.models import F

from controlplane import context
from simulator.world import SERVICE_USER, world_build
from tenancy.services import demo_admin_ensure

RESET = ".venv/bin/python manage.py changepassword USER"


def demo_setup() -> dict[str, str]:
    """Create the demo admin and world when missing; returns the new users' passwords by user name."""
    token_ctx = context.set_context(context.RequestContext(source="cli"))
    try:
        passwords = {}
        admin_password = demo_admin_ensure(username=settings.DEMO_ADMIN_USERNAME)
        if admin_password:
            passwords[settings.DEMO_ADMIN_USERNAME] = admin_password
        passwords.update(world_build().passwords)
    finally:
        context.reset(token_ctx)
    return passwords


def demo_users() -> list[tuple[str, str]]:
    """(username, role) of every active user a person logs in as: the provider's and the tenants' users."""
    users = (
        get_user_model()
        .objects.filter(is_active=True, membership__isnull=False)
        .exclude(username=SERVICE_USER)
        .order_by(F("membership__tenant__slug").asc(nulls_first=True), "membership__role", "username")
        .values_list("username", "membership__role")
    )
    return list(users)


def banner_text(
    *, url: str, users: list[tuple[str, str]], passwords: dict[str, str], ready: bool = True
) -> str:
    """The box: where to go, who to log in as (with the passwords made just now), how to set a new password."""
    width = max((len(name) for name, _ in users), default=4)
    rows = [
        f"  {name:<{width}}  {role:<15} {passwords.get(name, '(shown on first start)')}"
        for name, role in users
    ]
    lines = [
        f"Lockstep is {'up' if ready else 'still starting'}: open {url}/ and log in as",
        "",
        *rows,
        "",
        f"New password for a user:  {RESET}",
        "Other terminals: manage.py reads var/local.env (the same key, database and DEBUG)",
        "Ctrl-C stops everything.",
    ]
    inner = max(len(line) for line in lines) + 2
    return "\n".join(
        ["┌" + "─" * inner + "┐", *(f"│ {line:<{inner - 2}} │" for line in lines), "└" + "─" * inner + "┘"]
    )


def _wait(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _redis_answers() -> bool:
    try:
        return bool(
            redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1, socket_timeout=1).ping()
        )
    except redis.RedisError:
        return False


def _stack_ready(url: str) -> bool:
    """Web answers /readyz (database and Redis), and reports a worker's and beat's heartbeat."""
    try:
        answer = requests.get(f"{url}/readyz", timeout=2)
        body = answer.json()
    except (requests.RequestException, ValueError):
        return False
    return answer.ok and body["workers"]["ok"] and body["beat"]["ok"]


class Command(BaseCommand):
    help = "Create the demo's users and world if missing, wait for the stack, and print how to log in."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start"])
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the web process to wait for")
        parser.add_argument(
            "--wait", type=float, default=120.0, help="seconds to wait for Redis, then the stack"
        )

    def handle(self, *args, url, wait, **options):
        url = url.rstrip("/")
        # The world's services queue tasks and publish events: with Redis away each would wait for its timeout.
        if not _wait(_redis_answers, wait):
            self.stderr.write("Redis does not answer; building the demo world without it")
        passwords = demo_setup()
        ready = _wait(lambda: _stack_ready(url), wait)
        if not ready:
            self.stderr.write(f"{url}/readyz reported no worker or beat within {wait:.0f} s")
        self.stdout.write(banner_text(url=url, users=demo_users(), passwords=passwords, ready=ready))
