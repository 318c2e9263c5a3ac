"""Schemathesis against Lockstep's own OpenAPI schema: every operation, as a provider and as a tenant admin,
a bounded number of generated requests each. No input may produce a server error, and every answer must be
what the schema documents: a documented status code, a body of the documented shape, the documented media
type and headers.

Each request runs in a savepoint that is rolled back, as a request on its own would: a write does not change
the world the next request sees, and input the database refuses (a DataError) cannot poison the test's
transaction. Half of the requests to an operation with an ``{id}`` name an object that exists (one the user
sees in the list), so the success answers are checked too, not only the 404 of a random id.
"""

import collections

import pytest
import schemathesis
import werkzeug.test
from django.contrib.auth import get_user_model
from django.core.wsgi import get_wsgi_application
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from simulator.world import world_build
from tenancy.services import token_create
from tests.support.schema_checks import CHECKS

EXAMPLES = 5


def visible_ids(client, auth: dict, path: str) -> list[int]:
    """Ids the user sees in a list endpoint (the first page), to aim some requests at existing objects."""
    response = client.get(path, headers=auth)
    if response.status_code != 200 or response.mimetype != "application/json":
        return []
    body = response.get_json()
    rows = body.get("results", []) if isinstance(body, dict) else body
    return [row["id"] for row in rows if isinstance(row, dict) and isinstance(row.get("id"), int)]


class Fuzzer:
    """Sends generated requests with the user's token and keeps what did not answer as documented."""

    def __init__(self, auth: dict):
        self.auth = auth
        self.sent = 0
        self.failures: collections.Counter = collections.Counter()
        self.examples: dict = {}

    def run(self, operation, known: list[int]) -> None:
        @hypothesis_settings(
            max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=operation.as_strategy())
        def call(case):
            case.headers = {**(case.headers or {}), **self.auth}
            if known and self.sent % 2 == 0:
                case.path_parameters = {**case.path_parameters, "id": known[self.sent % len(known)]}
                if "number" in case.path_parameters:
                    case.path_parameters["number"] = 1
            self.sent += 1
            with transaction.atomic():
                response = case.call()
                transaction.set_rollback(True)
            try:
                case.validate_response(response, checks=CHECKS)
            except (Exception, BaseExceptionGroup) as error:
                for failure in getattr(error, "exceptions", [error]):
                    self.keep(case, response, failure)

        call()

    def keep(self, case, response, failure) -> None:
        key = (case.method, case.operation.path, response.status_code, type(failure).__name__)
        self.failures[key] += 1
        body = str(case.body)[:150] if case.body is not None else ""
        self.examples[key] = (
            f"{case.method} {case.formatted_path} {case.query or ''} {body} -> "
            f"{str(failure)[:1200]} | {response.text[:200]}"
        )

    def report(self) -> str:
        return "\n\n".join(f"{count} × {self.examples[key]}" for key, count in sorted(self.failures.items()))


@pytest.mark.django_db
@pytest.mark.usefixtures("keep_connection")
@pytest.mark.parametrize("username", ["lockstep-simulator", "nimbus-admin"])
def test_every_operation_answers_as_documented(username, settings, capsys):
    settings.ALLOWED_HOSTS = ["testserver", "localhost"]
    world_build(seed=3, nodes_per_cluster=8, spares=1)  # 8 nodes: a job on every cluster
    user = get_user_model().objects.get(username=username)
    _, raw = token_create(actor=user, owner=user, name="fuzz", scope="write")
    auth = {"Authorization": f"Bearer {raw}"}
    app = get_wsgi_application()
    schema = schemathesis.openapi.from_wsgi("/api/schema/", app, headers=auth)
    client = werkzeug.test.Client(app)
    operations = [result.ok() for result in schema.get_all_operations()]
    ids = {
        operation.path: visible_ids(client, auth, operation.path)
        for operation in operations
        if operation.method.upper() == "GET" and "{" not in operation.path
    }
    fuzzer = Fuzzer(auth)
    for operation in operations:
        fuzzer.run(
            operation, ids.get(operation.path.split("{id}")[0], []) if "{id}" in operation.path else []
        )
    with capsys.disabled():
        print(
            f"\nschemathesis as {username}: {fuzzer.sent} requests over {len(operations)} operations, "
            f"{sum(fuzzer.failures.values())} not as documented"
        )
    assert len(operations) > 50
    assert not fuzzer.failures, fuzzer.report()
