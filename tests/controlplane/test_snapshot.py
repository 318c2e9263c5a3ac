"""Reads made of several statements see one moment: a page and its count, the GPU-hours ledger's figures."""

import threading

import pytest
from django.db import connection
from django.db.models import F
from rest_framework.test import APIClient

from controlplane.access import Role
from controlplane.models import AuditEntry
from fleet.models import Fleet
from jobs.choices import ActionState
from jobs.models import RecoveryAction
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle
from tests.support.factories import make_fleet, make_user, token_header
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db(transaction=True)


def write_after_first_read(write, table: str = "", first: str = "SELECT COUNT("):
    """An execute wrapper that, once the first statement reading ``table`` has run (the paginator's count,
    unless ``first`` says otherwise), has another session write and commit."""
    written = []

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith(first) and f'"{table}"' in sql and not written:

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
    wrapper, written = write_after_first_read(
        lambda: make_fleet("a-fleet-written-meanwhile"), table=Fleet._meta.db_table
    )

    with connection.execute_wrapper(wrapper):
        answer = APIClient().get("/api/v1/fleets/", **header)

    assert written, "the other session never wrote"
    body = answer.json()
    # Fleets list by name, so the row written meanwhile sorts first: read at two moments, the page would be the
    # count's three rows cut from four, the newcomer in and fleet-2 out.
    assert [fleet["name"] for fleet in body["results"]] == names and body["count"] == 3, body
    after = APIClient().get("/api/v1/fleets/", **header).json()
    assert [fleet["name"] for fleet in after["results"]] == ["a-fleet-written-meanwhile", *names]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-moment page is PostgreSQL's")
def test_a_table_page_is_counted_and_fetched_as_of_one_moment(client):
    client.force_login(make_user(Role.PROVIDER_ADMIN))
    AuditEntry.objects.all().delete()
    names = [f"entry-{i}" for i in range(3)]
    for name in names:
        AuditEntry.objects.create(action="test.write", object_type="test", object_repr=name)
    wrapper, written = write_after_first_read(
        lambda: AuditEntry.objects.create(
            action="test.write", object_type="test", object_repr="written-meanwhile"
        ),
        table=AuditEntry._meta.db_table,
    )

    with connection.execute_wrapper(wrapper):
        page = client.get("/audit/").content.decode()

    assert written, "the other session never wrote"
    # Newest first: read at two moments, the page would be the newcomer and the two newest, entry-0 cut off.
    assert all(name in page for name in names) and "written-meanwhile" not in page
    assert "written-meanwhile" in client.get("/audit/").content.decode()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one moment is PostgreSQL's")
def test_the_ledgers_totals_groups_and_series_agree_while_an_action_completes(api, tenant_a):
    cluster = protected_cluster(nodes=4, spares=1, connection=INSTANT)
    job = submit(cluster, tenant_a, gpus=8)
    api.as_token(make_user(Role.OPERATOR))
    fault = api.post(
        "/api/v1/faults/", {"node": node_of(job).pk, "kind": "node_unreachable"}, format="json"
    ).json()
    fault_handle(fault_id=fault["id"])
    recovery_advance()
    (action,) = RecoveryAction.objects.filter(job=job, state=ActionState.SUCCEEDED)
    wrapper, written = write_after_first_read(
        lambda: RecoveryAction.objects.filter(pk=action.pk).update(
            gpu_hours_saved=F("gpu_hours_saved") + 100
        ),
        table=RecoveryAction._meta.db_table,
        first="SELECT",
    )

    with connection.execute_wrapper(wrapper):
        stats = api.get("/api/v1/stats/?group=fleet&bucket=minute").json()

    assert written, "the other session never wrote"
    saved = action.gpu_hours_saved
    # The groups were read before the write; the series and the totals must be read as of the same moment.
    assert (
        stats["groups"][0]["gpu_hours_saved"]
        == stats["totals"]["gpu_hours_saved"]
        == pytest.approx(saved, abs=1e-3)
    )
    assert stats["series"][-1]["cumulative"] == pytest.approx(saved, abs=1e-3), stats
    after = api.get("/api/v1/stats/?group=fleet&bucket=minute").json()
    assert after["totals"]["gpu_hours_saved"] == pytest.approx(saved + 100, abs=1e-3)
