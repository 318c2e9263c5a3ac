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

For ``values_list`` queries: each row comes back as the ORM's would, the columns Django converts on the way out
(JSON) converted as it converts them. Every argument must reach the SQL as a parameter
of its own (an equality or a comparison, not a list), which building checks.
"""

import datetime
import functools
import itertools
from collections.abc import Callable, Hashable

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import QuerySet

_counter = itertools.count(1)


def _stand_in(kind: type):
    """A value of ``kind`` for building, distinct from the other stand-ins of the same build (and, in practice, from
    the query's constants). An integer is small and positive: Django turns a lookup with a value out of the field's
    range (a PositiveSmallIntegerField's) into a query of no rows."""
    n = next(_counter)
    if kind is int:
        return 30_000 + n % 2_000
    if kind is str:
        return f"\x1fprepared-argument-{n}\x1f"
    if kind is datetime.datetime:
        return datetime.datetime(1903, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=n)
    raise TypeError(f"no stand-in for {kind!r}")


class PreparedQuery:
    """``build(**arguments) -> QuerySet`` (a ``values_list``), compiled once per shape from stand-ins of
    ``arguments`` (name → int, str or datetime), then ``rows(shape, **values)`` runs it with the values. The shape
    is whatever else the built SQL depends on: ``shape`` (None when nothing does; else passed to ``build`` first,
    as the caller's Principal for a scoped read), and which arguments are given (a value of None is not given:
    ``build`` gets only those that are, and adds a condition for each)."""

    def __init__(self, build: Callable[..., QuerySet], **arguments: type):
        self.build, self.arguments = build, arguments

    @functools.lru_cache(maxsize=256)  # noqa: B019 - the instances are module-level and live as long as the process
    def _compiled(self, shape: Hashable, given: tuple[str, ...]) -> tuple[str, list, dict] | None:
        """(SQL, its parameters' slots, the converters of its columns), or None for a query of no rows."""
        stand_ins = {name: _stand_in(self.arguments[name]) for name in given}
        queryset = self.build(shape, **stand_ins) if shape is not None else self.build(**stand_ins)
        compiler = queryset.query.get_compiler(connection=connection)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:
            if queryset.query.is_empty():
                return None  # a scope that sees nothing
            raise TypeError("PreparedQuery: the stand-ins built a query of no rows") from None
        by_value = {value: name for name, value in stand_ins.items()}
        slots = [
            by_value.get(value, _Constant(value)) if _hashable(value) else _Constant(value)
            for value in params
        ]
        missing = set(stand_ins) - {slot for slot in slots if isinstance(slot, str)}
        if missing:
            raise TypeError(
                f"PreparedQuery: {sorted(missing)} did not reach the SQL as parameters of their own"
            )
        converters = compiler.get_converters([expression for expression, _, _ in compiler.select])
        return sql, slots, converters

    def rows(self, shape: Hashable = None, **values) -> list[tuple]:
        values = {name: value for name, value in values.items() if value is not None}
        if connection.vendor != "postgresql":
            # Other backends change some values on their way into the SQL (SQLite writes a datetime as text), so the
            # compiled SQL could not take them as they come: the ORM builds the query each time there.
            return list(self.build(shape, **values) if shape is not None else self.build(**values))
        compiled = self._compiled(shape, tuple(sorted(values)))
        if compiled is None:
            return []
        sql, slots, converters = compiled
        params = [slot.value if isinstance(slot, _Constant) else values[slot] for slot in slots]
        with cursor() as rows_cursor:
            rows_cursor.execute(sql, params)
            rows = rows_cursor.fetchall()
        if not converters:
            return rows
        converted = []
        for row in rows:
            row = list(row)
            for position, (functions, expression) in converters.items():
                for function in functions:
                    row[position] = function(row[position], expression, connection)
            converted.append(tuple(row))
        return converted

    def first(self, shape: Hashable = None, **values) -> tuple | None:
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
