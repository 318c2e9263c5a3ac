"""Many-row upserts of latest state, fast on PostgreSQL: COPY into a temporary table, then one
INSERT … SELECT … ON CONFLICT DO UPDATE. Elsewhere (SQLite) Django's bulk_create does the same work."""

import orjson
from django.db import connection


def upsert(model, key: str, columns: list[str], rows: dict) -> None:
    """Insert or replace ``rows`` ({key value: {column: value}}) of ``model`` on its unique ``key`` column."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        objects = [model(**{key: pk, **{c: row[c] for c in columns}}) for pk, row in rows.items()]
        model.objects.bulk_create(objects, update_conflicts=True, unique_fields=[key.removesuffix("_id")],
                                  update_fields=[c.removesuffix("_id") if c.endswith("_id") else c for c in columns])
        return
    table = model._meta.db_table
    staging = f"{table}_in"
    names = [key, *columns]
    json_columns = {f.column for f in model._meta.concrete_fields if f.get_internal_type() == "JSONField"}
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table}) ON COMMIT DELETE ROWS")
        with cursor.connection.cursor().copy(f"COPY {staging} ({', '.join(names)}) FROM STDIN") as copy:
            for pk, row in rows.items():
                copy.write_row([pk, *[orjson.dumps(row[c]).decode() if c in json_columns else row[c] for c in columns]])
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns)
        cursor.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT {', '.join(names)} FROM {staging} "
                       f"ON CONFLICT ({key}) DO UPDATE SET {updates}")
        cursor.execute(f"DELETE FROM {staging}")
