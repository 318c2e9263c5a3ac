"""Reads of the shared machinery, each scoped to the user it reads for."""

from collections.abc import Iterable

from django.db.models import QuerySet

from controlplane import events
from controlplane.access import principal
from controlplane.models import AuditEntry, Event, TopicSequence


def event_list(*, user, topic: str | None, after: int | None = None) -> QuerySet[Event]:
    """Events of one topic the user may see, after a sequence number; providers may list every topic."""
    if topic is None:
        if not principal(user).is_provider:
            return Event.objects.none()
        rows = Event.objects.all().order_by("id")
    else:
        if not events.may_subscribe(user, topic):
            return Event.objects.none()
        rows = Event.objects.filter(topic=topic).order_by("seq")
    if after is not None:
        rows = rows.filter(seq__gt=after) if topic is not None else rows.filter(id__gt=after)
    return rows


def audit_list(*, user) -> QuerySet[AuditEntry]:
    if not principal(user).may_read_audit:
        return AuditEntry.objects.none()
    return AuditEntry.objects.all()


def topic_seq(topic: str) -> int:
    """The last sequence number of a topic: what a page rendered from the database has already seen."""
    if not topic:
        return 0
    return TopicSequence.objects.filter(topic=topic).values_list("last_seq", flat=True).first() or 0


def topic_heads(names: Iterable[str]) -> dict[str, int]:
    """``topic_seq`` for many topics in one query (0 where a topic has none yet). The caller has checked that
    the user may see every one of them."""
    names = list(names)
    found = dict(TopicSequence.objects.filter(topic__in=names).values_list("topic", "last_seq"))
    return {name: found.get(name, 0) for name in names}
