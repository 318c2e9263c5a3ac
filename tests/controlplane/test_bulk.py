"""update_rows: many rows written back in one statement, with the values save() would write."""

from datetime import timedelta

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.bulk import update_rows
from jobs.models import FaultEvent, Job
from tenancy.models import Tenant
from tests.support.factories import make_cluster, make_node
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db


def test_rows_get_their_own_values_in_one_statement_and_others_are_untouched():
    cluster, tenant = protected_cluster(nodes=8, spares=0), Tenant.objects.create(name="Bulk", slug="bulk")
    jobs = [submit(cluster, tenant, gpus=8, name=f"bulk-{i}") for i in range(3)]
    untouched = submit(cluster, tenant, gpus=8, name="untouched")
    before = Job.objects.get(pk=untouched.pk)
    at = timezone.now() - timedelta(minutes=5)
    for i, job in enumerate(jobs):
        job.iteration, job.iteration_at, job.state = 1000 + i, at + timedelta(seconds=i), "Recovering"
        job.slowdown, job.degraded_until = 0.25 * i, (at if i else None)
    with CaptureQueriesContext(connection) as queries:
        assert update_rows(jobs, ["iteration", "iteration_at", "state", "slowdown", "degraded_until"]) == 3
    if connection.vendor == "postgresql":
        assert len(queries) == 1
    for i, job in enumerate(jobs):
        row = Job.objects.get(pk=job.pk)
        assert (row.iteration, row.iteration_at, row.state, row.slowdown) == (
            1000 + i,
            at + timedelta(seconds=i),
            "Recovering",
            0.25 * i,
        )
        assert row.degraded_until == (at if i else None)
        assert row.name == f"bulk-{i}"  # fields not named are left alone
    after = Job.objects.get(pk=untouched.pk)
    assert (after.iteration, after.state, after.iteration_at) == (
        before.iteration,
        before.state,
        before.iteration_at,
    )


def test_json_and_text_values_round_trip_and_the_last_copy_of_a_row_wins():
    node = make_node(make_cluster(), "bulk-json", gpus=1, nics=1)
    now = timezone.now()
    faults = [
        FaultEvent.objects.create(
            kind="nic_down",
            cluster=node.cluster,
            node=node,
            detected_at=now,
            received_at=now,
            last_reported_at=now,
            correlation_key=f"bulk-{i}",
        )
        for i in range(2)
    ]
    faults[0].details, faults[0].state_reason = (
        {"rate": 1.5, "ports": ["p1", "p2"], "note": "naïve ✓"},
        'it\'s "quoted"',
    )
    faults[1].state_reason = "first"
    again = FaultEvent.objects.get(pk=faults[1].pk)
    again.state_reason = "second"
    update_rows([*faults, again], ["details", "state_reason"])
    assert FaultEvent.objects.get(pk=faults[0].pk).details == {
        "rate": 1.5,
        "ports": ["p1", "p2"],
        "note": "naïve ✓",
    }
    assert FaultEvent.objects.get(pk=faults[0].pk).state_reason == 'it\'s "quoted"'
    assert FaultEvent.objects.get(pk=faults[1].pk).state_reason == "second"


def test_a_value_too_long_for_its_column_is_refused_not_cut():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite does not enforce varchar lengths")
    cluster, tenant = protected_cluster(nodes=2, spares=0), Tenant.objects.create(name="Bulk", slug="bulk")
    job = submit(cluster, tenant, gpus=8, name="too-long")
    job.state = "x" * 50  # state is varchar(12)
    with pytest.raises(DataError), transaction.atomic():
        update_rows([job], ["state"])
    assert Job.objects.get(pk=job.pk).state != "x" * 50


def test_nothing_to_write_is_no_statement():
    with CaptureQueriesContext(connection) as queries:
        assert update_rows([], ["state"]) == 0
    assert not queries


def _columns(row) -> dict:
    return {f.attname: getattr(row, f.attname) for f in type(row)._meta.concrete_fields if not f.primary_key}


def test_insert_rows_writes_what_bulk_create_writes_and_sets_the_keys():
    from controlplane.audit import audit_entry
    from controlplane.bulk import insert_rows
    from controlplane.models import AuditEntry

    node = make_node(make_cluster())

    def entries():
        return [
            audit_entry(
                actor=None, action="bulk.test", target=node, changes={"n": n, "nested": [n, {"ok": True}]}
            )
            for n in range(3)
        ] + [AuditEntry(action="bulk.test", object_type="x", remote_addr="10.0.0.7", changes={})]

    mine, theirs = entries(), AuditEntry.objects.bulk_create(entries())
    assert insert_rows(mine) is mine  # bound on the server (nothing logs queries here)
    with CaptureQueriesContext(connection) as queries:
        insert_rows(entries())
    if connection.vendor == "postgresql":
        assert len(queries) == 1 and "unnest" in queries[0]["sql"]
    assert all(row.pk and not row._state.adding for row in mine)
    assert len({row.pk for row in mine}) == 4
    for row, other in zip(mine, theirs, strict=True):
        stored, expected = (
            _columns(AuditEntry.objects.get(pk=row.pk)),
            _columns(AuditEntry.objects.get(pk=other.pk)),
        )
        assert abs(stored.pop("created_at") - expected.pop("created_at")) < timedelta(
            seconds=5
        )  # auto_now_add
        assert stored == expected
    (single,) = insert_rows(entries()[3:])  # one row: its own statement, VALUES
    stored, expected = (
        _columns(AuditEntry.objects.get(pk=single.pk)),
        _columns(AuditEntry.objects.get(pk=mine[3].pk)),
    )
    assert abs(stored.pop("created_at") - expected.pop("created_at")) < timedelta(seconds=5)
    assert stored == expected and single.pk > mine[3].pk
    assert insert_rows([]) == []
    with pytest.raises(ValueError, match="has its key"):
        insert_rows([AuditEntry.objects.get(pk=mine[0].pk)])


def test_insert_rows_can_skip_the_rows_a_unique_constraint_refuses():
    from controlplane.bulk import insert_rows
    from jobs.models import NodeEscalation

    cluster = make_cluster()
    one, two = make_node(cluster), make_node(cluster)
    insert_rows([NodeEscalation(node_id=one.pk)], ignore_conflicts=True)
    insert_rows([NodeEscalation(node_id=one.pk), NodeEscalation(node_id=two.pk)], ignore_conflicts=True)
    assert sorted(NodeEscalation.objects.values_list("node_id", flat=True)) == sorted([one.pk, two.pk])
    assert NodeEscalation.objects.get(node=two).strikes == []  # the field's default, written
    with pytest.raises(IntegrityError), transaction.atomic():  # without: the constraint refuses the row
        insert_rows([NodeEscalation(node_id=one.pk)])
