"""PreparedQuery: a read compiled once from the ORM gives, for any values, the rows the ORM gives."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.access import ANONYMOUS, principal
from controlplane.prepared import PreparedQuery
from fleet import selectors as fleet_selectors
from fleet.models import GPU, Node
from jobs.models import FaultEvent
from tests.support.factories import make_cluster, make_node, make_tenant, make_user
from tests.support.statements import SentStatements

pytestmark = pytest.mark.django_db


def _faults(node, since):
    return (
        FaultEvent.objects.filter(node_id=node, received_at__gte=since, state="new")
        .order_by("received_at")
        .values_list("pk", "kind", "sources", "received_at")
    )


FAULTS = PreparedQuery(_faults, node=int, since=timezone.datetime)


def _fault(node, hours_ago, kind="nic_down"):
    at = timezone.now() - timedelta(hours=hours_ago)
    return FaultEvent.objects.create(
        cluster=node.cluster,
        node=node,
        kind=kind,
        sources=["agent", "alertmanager"],
        detected_at=at,
        received_at=at,
        last_reported_at=at,
        correlation_key=f"{node.pk}:{kind}:{hours_ago}",
    )


def test_rows_are_the_orms_for_every_value_and_the_sql_is_built_once():
    cluster = make_cluster()
    one, two = make_node(cluster), make_node(cluster)
    for node, hours in ((one, 1), (one, 3), (one, 30), (two, 2)):
        _fault(node, hours)
    FaultEvent.objects.filter(node=two).update(state="handled")
    for node, hours in ((one, 2), (one, 5), (one, 48), (two, 5)):
        since = timezone.now() - timedelta(hours=hours)
        assert FAULTS.rows(node=node.pk, since=since) == list(_faults(node.pk, since))
    # The JSON column comes back converted, as the ORM converts it; the state stays a constant of the SQL.
    assert FAULTS.rows(node=one.pk, since=timezone.now() - timedelta(days=9))[0][2] == [
        "agent",
        "alertmanager",
    ]
    with CaptureQueriesContext(connection) as queries:
        FAULTS.rows(node=one.pk, since=timezone.now())
    assert len(queries) == 1 and "'new'" in queries[0]["sql"]


def test_an_argument_not_given_leaves_its_condition_out():
    def gpus(node=None, index=None):
        rows = GPU.objects.all()
        if node is not None:
            rows = rows.filter(node_id=node)
        if index is not None:
            rows = rows.filter(index=index)
        return rows.order_by("pk").values_list("pk", flat=False)

    query = PreparedQuery(gpus, node=int, index=int)
    cluster = make_cluster()
    node = make_node(cluster, gpus=4)
    make_node(cluster, gpus=2)
    assert query.rows(node=node.pk) == list(gpus(node=node.pk))
    assert query.rows(index=1) == list(
        gpus(index=1)
    )  # a small-integer column, looked up by a value in its range
    assert query.rows(node=node.pk, index=3) == list(gpus(node=node.pk, index=3))
    assert query.first(node=node.pk, index=9) is None


def test_a_scoped_read_is_compiled_per_principal():
    cluster = make_cluster()
    node = make_node(cluster=cluster)
    admin = make_user("provider-admin")
    viewer = make_user("tenant-viewer", tenant=make_tenant("Prepared"))
    assert [n.pk for n in fleet_selectors.nodes_named(user=admin, node=node.pk)] == [node.pk]
    assert (
        fleet_selectors.nodes_named(user=viewer, node=node.pk) == []
    )  # a shared cluster's node: not the tenant's
    assert fleet_selectors.nodes_named(user=ANONYMOUS, node=node.pk) == []
    found = fleet_selectors.nodes_named(user=admin, hostname=node.hostname, cluster_name=cluster.name)
    assert found[0].hostname == node.hostname and found[0].cluster.name == cluster.name
    assert found[0].gpu_model == Node.objects.get(pk=node.pk).gpu_model  # a field not read: loaded when asked
    assert principal(admin) != principal(viewer)


def test_an_argument_that_does_not_reach_the_sql_is_refused_when_built():
    if connection.vendor != "postgresql":
        pytest.skip("elsewhere the ORM builds the query on each call: nothing is compiled to check")
    query = PreparedQuery(
        lambda node: Node.objects.filter(hostname__contains=node).values_list("pk"), node=str
    )
    with pytest.raises(TypeError, match="did not reach the SQL"):
        query.rows(node="gpu")


def test_on_postgresql_a_hot_statement_is_prepared_once_per_connection():
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    node = make_node(make_cluster())
    since = timezone.now() - timedelta(hours=1)
    with connection.cursor() as cursor:
        for _ in range(8):  # past OPTIONS["prepare_threshold"] (5)
            FAULTS.rows(node=node.pk, since=since)
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%jobs_faultevent%"]
        )
        (prepared,) = cursor.fetchone()
    assert prepared >= 1


def _nodes_locked(ids):
    return (
        Node.objects.select_for_update(of=("self",))
        .select_related("cluster__fleet")
        .annotate(has_third_gpu=Exists(GPU.objects.filter(node=OuterRef("pk"), index=2)))
        .filter(pk__in_array=ids)
        .order_by("pk")
    )


NODES_LOCKED = PreparedQuery(_nodes_locked, ids=list[int])


def test_model_rows_come_back_as_the_orms_instances_for_any_number_of_values():
    cluster = make_cluster()
    nodes = [make_node(cluster, gpus=n + 1) for n in range(4)]
    ids = [node.pk for node in nodes]
    with transaction.atomic():
        for chosen in (ids[:1], ids[1:3], ids, [ids[2], ids[0], 10**9], [], {ids[3]}):
            found, expected = NODES_LOCKED.rows(ids=chosen), list(_nodes_locked(chosen))
            assert [n.pk for n in found] == [n.pk for n in expected] == sorted(set(chosen) & set(ids))
            for mine, theirs in zip(found, expected, strict=True):
                assert isinstance(mine, Node) and not mine._state.adding
                assert {f.attname: getattr(mine, f.attname) for f in Node._meta.concrete_fields} == {
                    f.attname: getattr(theirs, f.attname) for f in Node._meta.concrete_fields
                }
                assert mine.has_third_gpu == theirs.has_third_gpu  # the annotation
                with CaptureQueriesContext(connection) as queries:
                    assert mine.cluster.fleet.name == cluster.fleet.name  # select_related, read beside it
                assert not queries
        # One statement text whatever the number of values: an array, not a parameter per value.
        with CaptureQueriesContext(connection) as queries:
            NODES_LOCKED.rows(ids=ids[:1])
            NODES_LOCKED.rows(ids=ids)
        if connection.vendor == "postgresql":
            assert "= ANY(" in queries[0]["sql"] and "FOR UPDATE" in queries[0]["sql"]


@pytest.mark.django_db(transaction=True)
def test_a_locking_read_outside_a_transaction_is_refused_as_the_orm_refuses_it():
    if not connection.features.has_select_for_update:
        pytest.skip("this database has no row locks")
    node = make_node(make_cluster())
    with pytest.raises(TransactionManagementError):
        NODES_LOCKED.rows(ids=[node.pk])
    with pytest.raises(TransactionManagementError):
        list(_nodes_locked([node.pk]))


def test_flat_values_and_a_list_of_strings():
    query = PreparedQuery(
        lambda names: (
            Node.objects.filter(hostname__in_array=names).order_by("hostname").values_list("pk", flat=True)
        ),
        names=list[str],
    )
    cluster = make_cluster()
    one, two = make_node(cluster), make_node(cluster)
    assert query.rows(names=[two.hostname, one.hostname, "nowhere"]) == sorted(
        [one.pk, two.pk], key=lambda pk: Node.objects.get(pk=pk).hostname
    )
    assert query.rows(names=[]) == []
    assert (
        Node.objects.filter(hostname__in_array=[one.hostname]).get() == one
    )  # the lookup, through the ORM too


@pytest.mark.skipif(connection.vendor != "postgresql", reason="binary parameters are PostgreSQL's")
def test_arrays_go_in_binary_where_bound_on_the_server_and_as_text_while_logged():
    """The same statement with ``array_placeholder`` gives the same rows through the server-bound cursor (binary
    arrays) and through Django's own while queries are logged (text), for values text must escape."""
    from controlplane.prepared import array_placeholder, cursor

    values = ['a "quoted", {braced} value', None, "back\\slash", "", "NULL"]
    results = []
    for logged in (False, True):
        with CaptureQueriesContext(connection) if logged else transaction.atomic():
            with cursor() as statement:
                placeholder = array_placeholder(statement)
                statement.execute(
                    f"SELECT v, n FROM unnest({placeholder}::text[], {placeholder}::bigint[]) AS t(v, n)",
                    [values, [1, None, 2**40, -3, 0]],
                )
                results.append((placeholder, statement.fetchall()))
    assert [placeholder for placeholder, _ in results] == ["%b", "%s"]
    assert results[0][1] == results[1][1] == list(zip(values, [1, None, 2**40, -3, 0], strict=True))


def test_a_compiled_reads_arrays_are_marked_for_binary_and_nothing_else():
    from controlplane.prepared import _arrays_in_binary

    sql = "SELECT 1 WHERE a LIKE '%%s' AND b = ANY(%s::integer[]) AND c = %s AND d = ANY(%s::varchar[])"
    assert _arrays_in_binary(sql, [[1, 2], 3, ["x"]]) == (
        "SELECT 1 WHERE a LIKE '%%s' AND b = ANY(%b::integer[]) AND c = %s AND d = ANY(%b::varchar[])"
    )


@pytest.mark.skipif(connection.vendor != "postgresql", reason="binary parameters are PostgreSQL's")
def test_a_compiled_read_sends_its_arrays_in_binary_and_finds_what_text_finds():
    """``in_array``'s values go in binary on the server-bound cursor (psycopg dumps a text array in Python, escaping
    each element) and as text while queries are logged; both find the same rows, for values text must escape."""
    query = PreparedQuery(
        lambda names, ids: (
            Node.objects.filter(hostname__in_array=names, pk__in_array=ids)
            .order_by("hostname")
            .values_list("hostname", flat=True)
        ),
        names=list[str],
        ids=list[int],
    )
    cluster = make_cluster()
    nodes = [
        make_node(cluster, hostname=name) for name in ('a "quoted", {b}', "back\\slash", "NULL", "plain")
    ]
    names = [node.hostname for node in nodes[:3]] + ["nowhere"]
    ids = [node.pk for node in nodes]
    with SentStatements() as sent:
        with transaction.atomic():
            binary = query.rows(names=names, ids=ids)
        with CaptureQueriesContext(connection):
            text = query.rows(names=names, ids=ids)
    assert binary == text == sorted(names[:3])
    reads = [statement for statement in sent.work() if "hostname" in statement]
    assert len(reads) == 2 and reads[0].count("%b") == 2 and "%b" not in reads[1], reads
