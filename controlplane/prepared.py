"""Hot reads compiled once per process: the ORM writes the SQL, once, and each call only runs it.

Django builds and compiles a queryset into SQL on every execution. On the fault path that is most of a statement's
CPU: a one-row lookup by key costs 1.0–1.7 ms of Python through the ORM against 0.26 ms as the same SELECT sent
directly (bench/fault_path_profile.py). ``PreparedQuery`` keeps the ORM as the one place that knows tables,
columns, joins and scoping: its ``build`` function makes the queryset from stand-in values, once per shape, and the
compiled SQL is then run with each call's values in their places.

That is on PostgreSQL, where the parameters reach the SQL as they are given; elsewhere (SQLite, the embedded
default, writes a datetime as text) the ORM builds the query on each call. On PostgreSQL a prepared query runs
through ``cursor()``, which sends the parameters apart from the text, so each pooled connection parses and plans
it once: planning was a fifth of PostgreSQL's CPU on the fault path (pg_stat_statements, docs/benchmarks.md).

Each result comes back as the ORM's would: a ``values_list`` row as a tuple (or its one value, ``flat``), a model
queryset's row as an instance with its ``select_related`` rows and annotations, the columns Django converts on the
way out (JSON, the encrypted fields) converted as it converts them. Every argument must reach the SQL as a parameter
of its own, which building checks: an equality or a comparison, or, for a list of values, the ``in_array`` lookup
(``pk__in_array=ids``), which sends the list as one array (``= ANY(%s)``) so that a read of any number of rows is one
statement text, compiled once and prepared once. Where the cursor binds on the server, that array goes in binary
(``array_placeholder``).
"""

import datetime
import functools
import itertools
import re
from collections.abc import Callable, Hashable
from typing import NamedTuple

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import Field, ForeignObject, Lookup, QuerySet
from django.db.models.query import (
    FlatValuesListIterable,
    ModelIterable,
    ValuesListIterable,
    get_related_populators,
)
from django.db.transaction import TransactionManagementError

_counter = itertools.count(1)
_LISTS = (list[int], list[str])


def _stand_in(kind: type):
    """A value of ``kind`` for building, distinct from the other stand-ins of the same build (and, in practice, from
    the query's constants). An integer is small and positive: Django turns a lookup with a value out of the field's
    range (a PositiveSmallIntegerField's) into a query of no rows."""
    n = next(_counter)
    if kind in _LISTS:
        (element,) = kind.__args__
        return [_stand_in(element), _stand_in(element)]
    if kind is int:
        return 30_000 + n % 2_000
    if kind is str:
        return f"\x1fprepared-argument-{n}\x1f"
    if kind is datetime.datetime:
        return datetime.datetime(1903, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=n)
    raise TypeError(f"no stand-in for {kind!r}")


class AnyOf(Lookup):
    """``field__in_array=values``: the field equals one of the values. On PostgreSQL the values are one parameter, an
    array (``= ANY(%s::type[])``), so the statement's text is the same for any number of them; elsewhere it is
    ``IN`` with a parameter each, as ``__in``."""

    lookup_name = "in_array"
    prepare_rhs = False

    def get_prep_lookup(self):
        return [self.lhs.output_field.get_prep_value(value) for value in self.rhs]

    def _values(self, connection) -> list:
        return [self.lhs.output_field.get_db_prep_value(v, connection, prepared=True) for v in self.rhs]

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = self._values(connection)
        if not values:
            raise EmptyResultSet
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", (*lhs_params, *values)

    def as_postgresql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        array = f"{self.lhs.output_field.db_type(connection)}[]"
        return f"{lhs} = ANY(%s::{array})", (*lhs_params, self._values(connection))


# On every field, and on foreign keys by their column (related fields keep a registry of lookups of their own).
Field.register_lookup(AnyOf)
ForeignObject.register_lookup(AnyOf)


class _Compiled(NamedTuple):
    """A built query: its SQL, its parameters' slots, its columns' converters, and how a row becomes a result; and
    its SQL with the array parameters (``in_array``'s) sent in binary, for a cursor that binds on the server."""

    sql: str
    slots: list
    converters: dict
    make: Callable | None
    for_update: bool
    binary_sql: str


_PLACEHOLDER = re.compile(r"%%|%s")


def _arrays_in_binary(sql: str, params) -> str:
    """The SQL with the placeholder of each list parameter made ``%b`` (see ``array_placeholder``)."""
    position = itertools.count()

    def placeholder(match: re.Match) -> str:
        if match[0] == "%%":
            return "%%"
        return "%b" if isinstance(params[next(position)], list) else "%s"

    return _PLACEHOLDER.sub(placeholder, sql)


class _Instances:
    """A model queryset's row made into its instance, as Django's ModelIterable makes it."""

    def __init__(self, queryset: QuerySet, compiler):
        klass_info, select = compiler.klass_info, compiler.select
        fields = klass_info["select_fields"]
        self.start, self.end = fields[0], fields[-1] + 1
        self.model, self.db = klass_info["model"], queryset.db
        self.names = [column[0].target.attname for column in select[self.start : self.end]]
        self.related = get_related_populators(klass_info, select, self.db)
        self.annotations = list(compiler.annotation_col_map.items())

    def __call__(self, row):
        instance = self.model.from_db(self.db, self.names, row[self.start : self.end])
        for populator in self.related:
            populator.populate(row, instance)
        for name, position in self.annotations:
            setattr(instance, name, row[position])
        return instance


def _maker(queryset: QuerySet, compiler):
    """How a row of this queryset becomes what iterating the queryset gives; None: the row as it is (a tuple)."""
    if queryset._prefetch_related_lookups or queryset._known_related_objects:
        raise TypeError("PreparedQuery: prefetch_related and related managers' querysets are not supported")
    if queryset._iterable_class is ModelIterable:
        return _Instances(queryset, compiler)
    if queryset._iterable_class is FlatValuesListIterable:
        return _first_column
    if queryset._iterable_class is ValuesListIterable:
        return None
    raise TypeError(f"PreparedQuery: {queryset._iterable_class.__name__} querysets are not supported")


def _first_column(row):
    return row[0]


def _slot_of(value, stand_ins: dict):
    """The argument a built query's parameter stands for (its name), or the parameter as a constant."""
    if isinstance(value, list):
        return next((name for name, stand_in in stand_ins.items() if stand_in == value), _Constant(value))
    if not _hashable(value):
        return _Constant(value)
    return next(
        (
            name
            for name, stand_in in stand_ins.items()
            if not isinstance(stand_in, list) and stand_in == value
        ),
        _Constant(value),
    )


class PreparedQuery:
    """``build(**arguments) -> QuerySet`` (a model queryset or a ``values_list``), compiled once per shape from
    stand-ins of ``arguments`` (name → int, str, datetime, list[int] or list[str]), then ``rows(shape, **values)``
    runs it with the values (a list argument may be given as any iterable). The shape is whatever else the built SQL
    depends on: ``shape`` (None when nothing does; else passed to ``build`` first, as the caller's Principal for a
    scoped read), and which arguments are given (a value of None is not given: ``build`` gets only those that are,
    and adds a condition for each)."""

    def __init__(self, build: Callable[..., QuerySet], **arguments: type):
        self.build, self.arguments = build, arguments

    @functools.lru_cache(maxsize=256)  # noqa: B019 - the instances are module-level and live as long as the process
    def _compiled(self, shape: Hashable, given: tuple[str, ...]) -> _Compiled | None:
        """The built query, or None for a query of no rows."""
        stand_ins = {name: _stand_in(self.arguments[name]) for name in given}
        queryset = self.build(shape, **stand_ins) if shape is not None else self.build(**stand_ins)
        compiler = queryset.query.get_compiler(connection=connection)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            if queryset.query.is_empty():
                return None  # a scope that sees nothing
            raise TypeError("PreparedQuery: the stand-ins built a query of no rows") from None
        slots = [_slot_of(value, stand_ins) for value in params]
        missing = set(stand_ins) - {slot for slot in slots if isinstance(slot, str)}
        if missing:
            raise TypeError(
                f"PreparedQuery: {sorted(missing)} did not reach the SQL as parameters of their own"
            )
        converters = compiler.get_converters([expression for expression, _, _ in compiler.select])
        return _Compiled(
            sql,
            slots,
            converters,
            _maker(queryset, compiler),
            bool(queryset.query.select_for_update),
            _arrays_in_binary(sql, params),
        )

    def rows(self, shape: Hashable = None, **values) -> list:
        """What iterating the built queryset with these values gives: tuples, values or instances."""
        values = {
            name: list(value) if self.arguments[name] in _LISTS else value
            for name, value in values.items()
            if value is not None
        }
        if connection.vendor != "postgresql":
            # Other backends change some values on their way into the SQL (SQLite writes a datetime as text), so the
            # compiled SQL could not take them as they come: the ORM builds the query each time there.
            return list(self.build(shape, **values) if shape is not None else self.build(**values))
        compiled = self._compiled(shape, tuple(sorted(values)))
        if compiled is None:
            return []
        if compiled.for_update and not connection.in_atomic_block:
            raise TransactionManagementError("select_for_update cannot be used outside of a transaction.")
        params = [slot.value if isinstance(slot, _Constant) else values[slot] for slot in compiled.slots]
        with cursor() as rows_cursor:
            binary = array_placeholder(rows_cursor) == "%b"
            rows_cursor.execute(compiled.binary_sql if binary else compiled.sql, params)
            rows = rows_cursor.fetchall()
        if compiled.converters:
            rows = [_converted(row, compiled.converters) for row in rows]
        return rows if compiled.make is None else [compiled.make(row) for row in rows]

    def first(self, shape: Hashable = None, **values):
        rows = self.rows(shape, **values)
        return rows[0] if rows else None


# PostgreSQL's limit on a server-bound statement's parameters is 65,535; past this many, bind on the client.
MAX_SERVER_PARAMETERS = 30_000


def cursor(parameters: int = 0):
    """A cursor of the default connection for a hot statement of fixed text and ``parameters`` parameters. On PostgreSQL it binds on the server
    (the parameters travel apart from the text), so after ``OPTIONS["prepare_threshold"]`` runs (settings.py) the
    connection has the statement prepared and PostgreSQL neither parses nor plans it again; Django's own cursors
    bind on the client and never prepare. It is Django's cursor wrapper around it, so execute wrappers (the query
    counters of tests and benchmarks) see every statement. While queries are logged (DEBUG, a test capturing
    them) it is Django's own cursor, whose log shows each statement with its values."""
    if connection.vendor != "postgresql" or connection.queries_logged or parameters > MAX_SERVER_PARAMETERS:
        return connection.cursor()
    import psycopg

    connection.ensure_connection()
    return connection.make_cursor(psycopg.Cursor(connection.connection))


def array_placeholder(cursor) -> str:
    """The placeholder for an array parameter on this cursor (from ``cursor()``): ``%b`` where the parameters are
    bound on the server, so the array goes in binary; psycopg dumps an array as text in Python, escaping each
    element, about four times the CPU (30 arrays of 8 values: 0.95 against 0.22 ms). ``%s`` on a cursor that binds
    on the client (Django's own, while queries are logged), which cannot send binary."""
    import psycopg

    raw = getattr(cursor, "cursor", cursor)
    return "%b" if isinstance(raw, psycopg.Cursor) and not isinstance(raw, psycopg.ClientCursor) else "%s"


def _converted(row: tuple, converters: dict) -> tuple:
    row = list(row)
    for position, (functions, expression) in converters.items():
        for function in functions:
            row[position] = function(row[position], expression, connection)
    return tuple(row)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


class _Constant:
    """A parameter of the built query that is not an argument (a state, a fixed limit): sent as built."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value
