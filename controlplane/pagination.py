"""Pagination of every list endpoint (its own module: DRF imports it while loading its generic views)."""

from contextlib import contextmanager

from django.db import connections, transaction
from rest_framework.pagination import PageNumberPagination


@contextmanager
def one_moment(using: str):
    """Run the reads inside as of one moment.

    Django's paginator counts the rows, then fetches a page of them, cut at the count: two statements, which under
    PostgreSQL's READ COMMITTED see two moments. A row written between them that sorts into the page pushes the
    page's last row out, so the answer lacks a row that is there before and after it (seen with the actions of a
    cluster whose nodes were being drained). On PostgreSQL both statements run in one REPEATABLE READ, read-only
    transaction. Inside a transaction already open, and on SQLite (whose transactions here take the write lock at
    BEGIN), they run as they are."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        with one_moment(getattr(queryset, "db", "default")):
            return super().paginate_queryset(queryset, request, view)
