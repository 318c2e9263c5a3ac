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


HISTORY = 20


def _first_text(payload) -> str:
    return next(
        (
            str(payload[key])
            for key in ("summary", "name", "hostname", "reason")
            if isinstance(payload, dict) and payload.get(key)
        ),
        "",
    )


def event_history(*, user, topic: str, up_to: int, limit: int = HISTORY, text=_first_text) -> list[dict]:
    """The last events of a topic the user may see, newest first, up to the sequence number the page subscribes
    after (later ones arrive live, so none shows twice): a live feed's history on render. ``text`` makes each
    line from the event's payload as the page's script writes a live one (static/js/live.js ``appendToFeed``)."""
    if not topic:
        return []
    rows = event_list(user=user, topic=topic).filter(seq__lte=up_to).order_by("-seq")[:limit]
    return [
        {"seq": event.seq, "kind": event.kind, "created": event.created_at, "text": text(event.payload)}
        for event in rows
    ]


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
