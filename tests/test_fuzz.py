"""Schemathesis against Lockstep's own OpenAPI schema: every operation, as a provider and as a tenant admin,
a bounded number of generated requests each. No input may produce a server error."""

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from simulator.world import world_build
from tenancy.services import token_create

EXAMPLES = 5


@pytest.fixture
def keep_connection():
    """The WSGI handler closes database connections around each request; inside a test's transaction it
    must not (Django's own test client disconnects the same receivers)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
@pytest.mark.usefixtures("keep_connection")
@pytest.mark.parametrize("username", ["lockstep-simulator", "nimbus-admin"])
def test_no_operation_answers_a_server_error(username, settings, capsys):
    settings.ALLOWED_HOSTS = ["testserver", "localhost"]
    world_build(seed=3, nodes_per_cluster=4, spares=1)
    user = get_user_model().objects.get(username=username)
    _, raw = token_create(actor=user, owner=user, name="fuzz", scope="write")
    auth = {"Authorization": f"Bearer {raw}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(), headers=auth)
    errors, sent = [], [0]
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None,
                             suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def call(case):
            case.headers = {**(case.headers or {}), **auth}
            response = case.call()
            sent[0] += 1
            if response.status_code >= 500:
                errors.append(f"{case.method} {case.path} {case.query} {str(case.body)[:120]}")

        call()
    with capsys.disabled():
        print(f"\nschemathesis as {username}: {sent[0]} requests over {len(operations)} operations, "
              f"{len(errors)} server errors")
    assert len(operations) > 50
    assert errors == []
