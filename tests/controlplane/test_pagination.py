"""A page of a list endpoint is counted and fetched as of one moment."""

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.access import Role
from tests.conftest import make_user, token_header
from tests.fleet_factories import make_fleet

pytestmark = pytest.mark.django_db(transaction=True)


def write_between_count_and_page(write):
    """An execute wrapper that, once the paginator's count has run, has another session write and commit."""
    written = []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("SELECT COUNT(") and not written:
            def other_session():
                try:
                    written.append(write())
                finally:
                    connection.close()
            thread = threading.Thread(target=other_session)
            thread.start()
            thread.join()
        return result

    return wrapper, written


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-moment page is PostgreSQL's")
def test_a_row_written_between_the_count_and_the_page_leaves_out_no_row_that_was_there():
    names = [f"fleet-{i}" for i in range(3)]
    for name in names:
        make_fleet(name)
    header = token_header(make_user(Role.OPERATOR), "read")
    wrapper, written = write_between_count_and_page(lambda: make_fleet("a-fleet-written-meanwhile"))

    with connection.execute_wrapper(wrapper):
        answer = APIClient().get("/api/v1/fleets/", **header)

    assert written, "the other session never wrote"
    body = answer.json()
    # Fleets list by name, so the row written meanwhile sorts first: read at two moments, the page would be the
    # count's three rows cut from four, the newcomer in and fleet-2 out.
    assert [fleet["name"] for fleet in body["results"]] == names and body["count"] == 3, body
    after = APIClient().get("/api/v1/fleets/", **header).json()
    assert [fleet["name"] for fleet in after["results"]] == ["a-fleet-written-meanwhile", *names]
