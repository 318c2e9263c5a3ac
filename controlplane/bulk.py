"""Writing many rows back in one statement, cheaply.

Django's ``bulk_update`` writes one ``CASE WHEN pk = … THEN …`` per field and row, built and compiled as
expressions; for the few dozen rows a recovery decision or a batch of completions writes, that compiling cost
more CPU than the rest of the work (profiled under bench/fault_latency.py: 70 % of completing actions). On
PostgreSQL ``update_rows`` joins a ``VALUES`` list instead: each value prepared by its field as ``save()`` would,
bound as a parameter and cast to the column's type. Elsewhere (SQLite, the embedded default) it is
``bulk_update``.
"""

from django.db import connection
from django.db.models import Model

ROWS_PER_STATEMENT = 1000  # a statement's parameters stay far below PostgreSQL's 65,535


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
