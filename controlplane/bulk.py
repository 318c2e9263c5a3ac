"""Writing many rows back in one statement, cheaply.

Django's ``bulk_update`` writes one ``CASE WHEN pk = … THEN …`` per field and row, built and compiled as
expressions; for the few dozen rows a recovery decision or a batch of completions writes, that compiling cost
more CPU than the rest of the work (profiled under bench/fault_latency.py: 70 % of completing actions). On
PostgreSQL ``update_rows`` joins a ``VALUES`` list instead: each value prepared by its field as ``save()`` would,
bound as a parameter and cast to the column's type. On SQLite (the embedded default, and the what-if's scratch
store) it joins a ``VALUES`` list the same way (``UPDATE … FROM``, SQLite 3.33 and later; the escalation ladder's
beat step spent half its time in ``bulk_update`` there). Elsewhere it is ``bulk_update``.
"""

from typing import NamedTuple

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model, Value
from django.db.models.expressions import DatabaseDefault

ROWS_PER_STATEMENT = 1000  # a statement's parameters stay far below PostgreSQL's 65,535
SQLITE_PARAMETERS = 900  # below the 999 variables of SQLite builds older than 3.32
SQLITE_UPDATE_FROM = (3, 33, 0)


_casts: dict = {}


def _cast(field) -> str:
    cast = _casts.get(field)
    if cast is None:
        kind = field.cast_db_type(connection)
        # A value too long for varchar(n) is refused on assignment, but an explicit cast to varchar(n) would cut it.
        cast = _casts[field] = "text" if kind.startswith("varchar") else kind
    return cast


def update_rows(objs: list[Model], fields: list[str]) -> int:
    """Write ``fields`` of these instances (all of one model, saved before) to their rows; returns how many
    rows changed. Like ``bulk_update``: no signals, no ``auto_now``; values only, not expressions."""
    if not objs:
        return 0
    model = type(objs[0])
    sqlite = connection.vendor == "sqlite" and connection.Database.sqlite_version_info >= SQLITE_UPDATE_FROM
    if connection.vendor != "postgresql" and not sqlite:
        return model.objects.bulk_update(objs, fields)
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    names = ", ".join(quote(field.column) for field in [meta.pk, *columns])
    assignments = ", ".join(f"{quote(field.column)} = v.{quote(field.column)}" for field in columns)
    if sqlite:
        row = "(" + ", ".join(["%s"] * (len(columns) + 1)) + ")"
        per_statement = max(1, SQLITE_PARAMETERS // (len(columns) + 1))

        def statement(values: str) -> str:
            return f"WITH v({names}) AS (VALUES {values}) UPDATE {table} SET {assignments} FROM v WHERE {table}.{pk} = v.{pk}"
    else:
        row = "(" + ", ".join(f"%s::{_cast(field)}" for field in [meta.pk, *columns]) + ")"
        per_statement = ROWS_PER_STATEMENT

        def statement(values: str) -> str:
            return f"UPDATE {table} AS t SET {assignments} FROM (VALUES {values}) AS v({names}) WHERE t.{pk} = v.{pk}"

    batch = list({obj.pk: obj for obj in objs}.values())  # a row listed twice gets its last values
    changed = 0
    with connection.cursor() as cursor:
        for start in range(0, len(batch), per_statement):
            chunk = batch[start : start + per_statement]
            cursor.execute(statement(", ".join([row] * len(chunk))), _params(chunk, meta.pk, columns))
            changed += cursor.rowcount
    return changed


def _params(chunk: list[Model], pk, columns) -> list:
    """Each row's key and values, each prepared by its field as ``save()`` would."""
    params = []
    for obj in chunk:
        params.append(pk.get_db_prep_save(obj.pk, connection))
        for field in columns:
            value = getattr(obj, field.attname)
            if hasattr(value, "resolve_expression"):
                raise TypeError(f"update_rows writes values, not expressions ({field.name})")
            params.append(field.get_db_prep_save(value, connection))
    return params


_inserts: dict = {}


class _Insert(NamedTuple):
    """How ``insert_rows`` writes a model's new rows: its fields, and the INSERT of one row and of many."""

    fields: list
    one: str  # VALUES, a parameter per column
    many: str  # unnest, an array per column; its placeholders are {array} (controlplane.prepared.array_placeholder)


def _insert_of(model, ignore_conflicts: bool) -> _Insert | None:
    """The INSERTs of new rows of ``model`` (None: a model ``insert_rows`` leaves to ``bulk_create``)."""
    key = (model, ignore_conflicts)
    if key not in _inserts:
        meta = model._meta
        fields = [f for f in meta.concrete_fields if f is not meta.pk and not f.generated]
        auto_key = meta.pk.get_internal_type() in ("AutoField", "BigAutoField", "SmallAutoField")
        if not auto_key or any(hasattr(field, "get_placeholder") for field in fields):
            _inserts[key] = None
            return None
        quote = connection.ops.quote_name
        into = f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        end = " ON CONFLICT DO NOTHING" if ignore_conflicts else f" RETURNING {quote(meta.pk.column)}"
        types = [field.db_type(connection).split("(")[0] for field in fields]
        _inserts[key] = _Insert(
            fields,
            into + f"VALUES ({', '.join(f'%s::{kind}' for kind in types)})" + end,
            into + f"SELECT * FROM unnest({', '.join(f'{{array}}::{kind}[]' for kind in types)})" + end,
        )
    return _inserts[key]


def insert_rows(objs: list[Model], *, ignore_conflicts: bool = False) -> list[Model]:
    """Insert new instances (all of one model, keys not set) as ``bulk_create`` does, and set their keys (not with
    ``ignore_conflicts``, which skips the rows that would break a unique constraint, as ``bulk_create`` does).

    On PostgreSQL it is one statement of fixed text, bound on the server (``controlplane.prepared.cursor``): each
    connection parses and plans it once, and no INSERT is compiled (``bulk_create`` compiles one on every call).
    One row goes as VALUES, more as an array per column through ``unnest`` (the same text for any number of rows;
    an array costs more to send than a value). A field left to its database default gets that value
    (``db_default``, a constant). A model whose fields take values of their own placeholders, or a value that is
    an expression, goes through ``bulk_create``; so does every other database."""
    if not objs:
        return objs
    model = type(objs[0])
    db = connections[DEFAULT_DB_ALIAS]
    insert = _insert_of(model, ignore_conflicts) if db.vendor == "postgresql" else None
    if insert is None:
        return model.objects.bulk_create(objs, ignore_conflicts=ignore_conflicts)
    rows = []
    for obj in objs:
        if obj.pk is not None:
            raise ValueError(f"insert_rows inserts new rows: {model.__name__} {obj.pk} has its key")
        obj._prepare_related_fields_for_save(operation_name="bulk_create")
        row = []
        for field in insert.fields:
            value = field.pre_save(obj, True)
            if isinstance(value, DatabaseDefault) and isinstance(field.db_default, Value):
                value = field.db_default.value  # the column's default, written as DEFAULT would write it
            if hasattr(value, "as_sql"):
                return model.objects.bulk_create(objs, ignore_conflicts=ignore_conflicts)
            row.append(field.get_db_prep_save(value, db))
        rows.append(row)
    from controlplane.prepared import array_placeholder, cursor

    one = len(rows) == 1
    with cursor(len(insert.fields)) as statement:
        statement.execute(
            insert.one if one else insert.many.replace("{array}", array_placeholder(statement)),
            rows[0] if one else [list(c) for c in zip(*rows, strict=True)],
        )
        keys = [] if ignore_conflicts else statement.fetchall()
    for obj, (pk,) in zip(objs, keys, strict=False):
        obj.pk = pk
    for obj in objs:
        obj._state.adding, obj._state.db = False, db.alias
    return objs
