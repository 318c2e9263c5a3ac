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
    if connection.vendor == "sqlite" and connection.Database.sqlite_version_info >= SQLITE_UPDATE_FROM:
        return _update_rows_sqlite(model, objs, fields)
    if connection.vendor != "postgresql":
        return model.objects.bulk_update(objs, fields)
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    last = {obj.pk: obj for obj in objs}  # a row listed twice gets its last values, as with bulk_update
    row = "(" + ", ".join(f"%s::{_cast(field)}" for field in [meta.pk, *columns]) + ")"
    names = ", ".join(quote(field.column) for field in [meta.pk, *columns])
    assignments = ", ".join(f"{quote(field.column)} = v.{quote(field.column)}" for field in columns)
    changed = 0
    batch = list(last.values())
    with connection.cursor() as cursor:
        for start in range(0, len(batch), ROWS_PER_STATEMENT):
            chunk = batch[start : start + ROWS_PER_STATEMENT]
            params = []
            for obj in chunk:
                params.append(meta.pk.get_db_prep_save(obj.pk, connection))
                for field in columns:
                    value = getattr(obj, field.attname)
                    if hasattr(value, "resolve_expression"):
                        raise TypeError(f"update_rows writes values, not expressions ({field.name})")
                    params.append(field.get_db_prep_save(value, connection))
            cursor.execute(
                f"UPDATE {quote(meta.db_table)} AS t SET {assignments} "
                f"FROM (VALUES {', '.join([row] * len(chunk))}) AS v({names}) "
                f"WHERE t.{quote(meta.pk.column)} = v.{quote(meta.pk.column)}",
                params,
            )
            changed += cursor.rowcount
    return changed


def _update_rows_sqlite(model, objs: list[Model], fields: list[str]) -> int:
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    pk = quote(meta.pk.column)
    names = ", ".join(quote(field.column) for field in [meta.pk, *columns])
    assignments = ", ".join(f"{quote(field.column)} = v.{quote(field.column)}" for field in columns)
    row = "(" + ", ".join(["%s"] * (len(columns) + 1)) + ")"
    batch = list({obj.pk: obj for obj in objs}.values())  # a row listed twice gets its last values
    per_statement = max(1, SQLITE_PARAMETERS // (len(columns) + 1))
    changed = 0
    with connection.cursor() as cursor:
        for start in range(0, len(batch), per_statement):
            chunk = batch[start : start + per_statement]
            params = []
            for obj in chunk:
                params.append(meta.pk.get_db_prep_save(obj.pk, connection))
                for field in columns:
                    value = getattr(obj, field.attname)
                    if hasattr(value, "resolve_expression"):
                        raise TypeError(f"update_rows writes values, not expressions ({field.name})")
                    params.append(field.get_db_prep_save(value, connection))
            cursor.execute(
                f"WITH v({names}) AS (VALUES {', '.join([row] * len(chunk))}) "
                f"UPDATE {quote(meta.db_table)} SET {assignments} FROM v WHERE {quote(meta.db_table)}.{pk} = v.{pk}",
                params,
            )
            changed += cursor.rowcount
    return changed
