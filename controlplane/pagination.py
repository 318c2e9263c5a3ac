"""Pagination of every list endpoint and table page (its own module: DRF imports it while loading its generic
views)."""

from django.core.paginator import Paginator
from rest_framework.pagination import PageNumberPagination

from controlplane.snapshot import one_moment


class OneMomentPaginator(Paginator):
    """Django's paginator counts the rows, then fetches a page of them cut at the count: two statements. A row
    written between them that sorts into the page pushed the page's last row out, so the answer lacked a row that
    was there before and after it (seen with the actions of a cluster whose nodes were being drained). Here the
    count and the page are read as of one moment, and the page is fetched before it is handed back. (Lockstep has
    one database.)"""

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
