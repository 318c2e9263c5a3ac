"""Many-row writes of telemetry in few statements, whatever the number of rows.

On PostgreSQL a table's rows travel as ONE JSON document, which ``jsonb_populate_recordset`` expands into the
table's own row type, and the writes to several tables run as ONE data-modifying ``WITH`` statement
(``Statement``). A statement's text depends only on which tables it writes, not on how many rows, so it can
be prepared (``fetch``). This replaced a temporary table, a COPY, an INSERT … SELECT and a DELETE per table:
more readings per second for big relay batches (bench/ingest_throughput.py), a fraction of the fixed cost for
one node's batch (bench/ingest_small.py).

Elsewhere (SQLite, for local runs) Django's bulk_create does the same work (``upsert``).
"""

import orjson
import psycopg
from django.db import DataError, connection


class Statement:
    """INSERTs (optionally ON CONFLICT … DO UPDATE) and UPDATEs run together as one statement.

    Each part sees the database as it was when the statement began, and two parts must not write the same row
    (nor one part the same row twice: rows of an upsert need distinct keys)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.params: list = []

    def insert(
        self, model, columns: list[str], rows: list[dict], *, conflict: str = "", update: str = ""
    ) -> None:
        """Insert ``rows`` (dicts holding at least ``columns``; a missing key is NULL, not the column default).
        ``conflict`` names the unique columns, ``update`` the SET list taken on a conflict (``excluded.…``)."""
        if not rows:
            return
        table, names = model._meta.db_table, ", ".join(columns)
        sql = f"INSERT INTO {table} ({names}) SELECT {names} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"
        if conflict:
            sql += f" ON CONFLICT ({conflict}) DO UPDATE SET {update}"
        try:
            document = orjson.dumps(rows).decode()
        except (
            orjson.JSONEncodeError
        ) as error:  # an integer beyond 64 bits: no column takes it (answered 400)
            raise DataError(f"a value is out of the range the database accepts: {error}") from error
        self.parts.append(sql)
        self.params.append(document)

    def upsert(self, model, key: str, columns: list[str], rows: list[dict]) -> None:
        """Insert or replace ``rows`` of ``model`` on its unique ``key`` column: every column but the key is set."""
        self.insert(
            model,
            [key, *columns],
            rows,
            conflict=key,
            update=", ".join(f"{c} = excluded.{c}" for c in columns),
        )

    def update(self, sql: str, params: list) -> None:
        self.parts.append(sql)
        self.params += params

    def sql(self) -> str:
        parts = ", ".join(f"w{i} AS ({part})" for i, part in enumerate(self.parts))
        return f"WITH {parts} SELECT 1"

    def execute(self) -> None:
        if self.parts:
            fetch(self.sql(), self.params)


def fetch(sql: str, params: list) -> tuple | None:
    """Run one statement in the default connection's current transaction and return its first row. Errors come
    out as Django's (DataError answers 400, OperationalError 503).

    Unlike Django's cursors, which bind on the client, this one sends the parameters apart from the text: a relay
    batch's JSON is not escaped into the SQL (about a quarter more readings per second than through Django's
    cursor), and the statement can be prepared. Django turns prepared statements off (prepare_threshold None,
    for transaction-mode poolers); with ``OPTIONS["prepare_threshold"]`` set, each pooled connection parses and
    plans these statements once (measured: about a third less PostgreSQL CPU for a one-node batch). Django's own
    cursors never prepare, whatever that option says."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() if cursor.description else None


def upsert(model, key: str, columns: list[str], rows: list[dict]) -> None:
    """Insert or replace ``rows`` of ``model`` on its unique ``key`` column with Django (not PostgreSQL)."""
    if not rows:
        return
    objects = [model(**{key: row[key], **{c: row[c] for c in columns}}) for row in rows]
    model.objects.bulk_create(
        objects,
        update_conflicts=True,
        unique_fields=[key.removesuffix("_id")],
        update_fields=[c.removesuffix("_id") if c.endswith("_id") else c for c in columns],
    )
