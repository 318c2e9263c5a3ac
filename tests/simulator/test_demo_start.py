"""`manage.py demo start` (make run's simulator process, before the simulation): the box that says how to log in."""

import pytest

from simulator.management.commands.demo import RESET, banner_text, demo_users
from simulator.world import SERVICE_USER
from tenancy.choices import Role
from tests.support.factories import make_tenant, make_user

pytestmark = pytest.mark.django_db


def test_the_box_lists_every_login_with_new_passwords_and_how_to_set_one():
    make_user(Role.PROVIDER_ADMIN, username="admin")
    make_user(Role.TENANT_ADMIN, make_tenant(slug="acme"), username="acme-admin")
    make_user(Role.PROVIDER_ADMIN, username=SERVICE_USER)
    users = demo_users()
    assert users == [("admin", Role.PROVIDER_ADMIN), ("acme-admin", Role.TENANT_ADMIN)]
    box = banner_text(url="http://127.0.0.1:8000", users=users, passwords={"acme-admin": "s3cret-pass"})
    lines = box.splitlines()
    assert lines[0].startswith("┌") and lines[-1].startswith("└") and len({len(line) for line in lines}) == 1
    assert "http://127.0.0.1:8000/" in box and RESET in box and "manage.py changepassword" in RESET
    row = {line.split()[1]: line for line in lines if "admin" in line and "│   " in line}
    assert "s3cret-pass" in row["acme-admin"] and "shown on first start" in row["admin"]
    assert SERVICE_USER not in box
    assert "still starting" in banner_text(url="http://x", users=users, passwords={}, ready=False)
