"""Reads as of one moment.

Under PostgreSQL's READ COMMITTED each statement sees the database as of its own start, so a read made of
several statements — a page and its count, a ledger's totals and its series, a job's timeline from five tables —
can mix two moments: a page that lost its last row to one written between its statements, a series whose last
running total is not the total beside it. ``one_moment()`` runs such a read in one REPEATABLE READ, read-only
transaction, which sees every statement as of the first.
"""

from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections, transaction


@contextmanager
def one_moment(using: str = DEFAULT_DB_ALIAS):
    """The reads inside see one moment: on PostgreSQL in one REPEATABLE READ, read-only transaction. Inside a
    transaction already open, and on SQLite (whose transactions here take the write lock at BEGIN), they run as
    they are."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
