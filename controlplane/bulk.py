"""Writing many rows back in one statement, cheaply.

Django's ``bulk_update`` writes one ``CASE WHEN pk = … THEN …`` per field and row, built and compiled as
expressions; for the few dozen rows a recovery decision or a batch of completions writes, that compiling cost
more CPU than the rest of the work (profiled under bench/fault_latency.py: 70 % of completing actions). On
PostgreSQL ``update_rows`` joins a ``VALUES`` list instead: each value prepared by its field as ``save()`` would,
bound as a parameter and cast to the column's type. On SQLite (the embedded default, and the what-if's scratch
store) it joins a ``VALUES`` list the same way (``UPDATE … FROM``, SQLite 3.33 and later; the escalation ladder's
beat step spent half its time in ``bulk_update`` there). Elsewhere it is ``bulk_update``.
"""

from django.db import connection
from django.db.models import Model

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
