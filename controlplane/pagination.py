"""Pagination of every list endpoint and table page (its own module: DRF imports it while loading its generic
views)."""

from contextlib import contextmanager

from django.core.paginator import Paginator
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from rest_framework.pagination import PageNumberPagination


@contextmanager
def one_moment(using: str = DEFAULT_DB_ALIAS):
    """Run the reads inside as of one moment: on PostgreSQL in one REPEATABLE READ, read-only transaction. Inside
    a transaction already open, and on SQLite (whose transactions here take the write lock at BEGIN), they run as
    they are."""
    connection = connections[using]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


class OneMomentPaginator(Paginator):
    """Django's paginator counts the rows, then fetches a page of them cut at the count: two statements, which
    under READ COMMITTED see two moments. A row written between them that sorts into the page pushed the page's
    last row out, so the answer lacked a row that was there before and after it (seen with the actions of a
    cluster whose nodes were being drained). Here the count and the page are read as of one moment, and the page
    is fetched before it is handed back. (Lockstep has one database.)"""

    def page(self, number):
        with one_moment():
            page = super().page(number)
            page.object_list = list(page.object_list)
        return page


class Pagination(PageNumberPagination):
    django_paginator_class = OneMomentPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
