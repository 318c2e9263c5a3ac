"""Label selection on ``Cluster.labels`` that works on PostgreSQL (JSON containment, in the database) and on the
embedded SQLite (which has no JSON containment lookup: matched in Python over (id, labels) pairs)."""

from django.db import connection
from django.db.models import QuerySet


def with_labels(queryset: QuerySet, labels: dict[str, str]) -> QuerySet:
    """The rows whose labels include every key with the given value."""
    if connection.features.supports_json_field_contains:
        return queryset.filter(labels__contains=labels)
    ids = [
        pk
        for pk, have in queryset.values_list("pk", "labels")
        if isinstance(have, dict) and all(have.get(k) == v for k, v in labels.items())
    ]
    return queryset.filter(pk__in=ids)
