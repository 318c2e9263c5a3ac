"""Live events: the topic registry, the one publish(), and the outbox relay.

A service calls ``publish()`` inside its transaction. That writes one Event row per topic, each with the
next sequence number of its topic, and registers an after-commit hook that relays the rows to the
channel-layer groups. A rolled-back transaction leaves no Event and sends nothing. What the relay could not
send (Redis away, the process killed) stays unsent and is sent by ``outbox_sweep`` on beat; clients
drop duplicates by sequence number and catch up from ``/api/v1/events/?topic=…&after=<seq>``.
"""

import asyncio
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from controlplane.access import Principal, principal
from controlplane.models import Event, TopicSequence

log = logging.getLogger(__name__)

TOPIC_PATTERN = re.compile(r"^(?P<prefix>[a-z][a-z0-9]{0,30})(?:-(?P<key>[0-9]{1,18}))?$")


class UnknownTopic(ValueError):
    pass


@dataclass(frozen=True)
class TopicKind:
    prefix: str
    keyed: bool
    may_subscribe: Callable[[Principal, int | None], bool]


_topics: dict[str, TopicKind] = {}


def register_topic(prefix: str, *, keyed: bool, may_subscribe: Callable[[Principal, int | None], bool]) -> None:
    """Declare a topic family (``fleet``, ``job-<id>``…) and who may subscribe to it."""
    _topics[prefix] = TopicKind(prefix, keyed, may_subscribe)


def registered_topics() -> dict[str, TopicKind]:
    return dict(_topics)


def topic(prefix: str, key: int | None = None) -> str:
    """The name of a topic: ``topic("job", 17) == "job-17"``; raises UnknownTopic for an unregistered family."""
    kind = _topics.get(prefix)
    if kind is None:
        raise UnknownTopic(f"unknown topic family {prefix!r}")
    if kind.keyed != (key is not None):
        raise UnknownTopic(f"topic {prefix!r} {'needs' if kind.keyed else 'takes no'} key")
    return prefix if key is None else f"{prefix}-{int(key)}"


def parse_topic(name: str) -> tuple[TopicKind, int | None]:
    match = TOPIC_PATTERN.match(name) if isinstance(name, str) else None
    if not match:
        raise UnknownTopic(f"malformed topic {name!r}")
    kind = _topics.get(match["prefix"])
    key = int(match["key"]) if match["key"] is not None else None
    if kind is None or kind.keyed != (key is not None):
        raise UnknownTopic(f"unknown topic {name!r}")
    return kind, key


def group_name(name: str) -> str:
    """The channel-layer group of a topic; the only place group names are built."""
    parse_topic(name)
    return f"lockstep.{name}"


def may_subscribe(user, name: str) -> bool:
    """May this user see the events of this topic? Unknown topics are refused."""
    try:
        kind, key = parse_topic(name)
    except UnknownTopic:
        return False
    who = principal(user)
    return who.is_authenticated and bool(kind.may_subscribe(who, key))


def _next_seq(name: str) -> int:
    table = TopicSequence._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (topic, last_seq) VALUES (%s, 1) "
            f"ON CONFLICT (topic) DO UPDATE SET last_seq = {table}.last_seq + 1 RETURNING last_seq",
            [name],
        )
        return cursor.fetchone()[0]


def publish(topics: Iterable[str], kind: str, payload: dict | None = None, url: str = "") -> list[Event]:
    """Record an event for each topic in the current transaction and relay it after commit."""
    names = list(dict.fromkeys(topics))
    for name in names:
        parse_topic(name)
    with transaction.atomic():
        # Sequence rows are bumped in sorted order so two transactions never wait on each other in a cycle.
        seqs = {name: _next_seq(name) for name in sorted(names)}
        events = Event.objects.bulk_create(
            [Event(topic=name, seq=seqs[name], kind=kind, payload=payload or {}, url=url) for name in names]
        )
        messages = [(event.pk, event.as_message()) for event in events]
        transaction.on_commit(lambda: relay(messages))
    return events


async def _send(messages: list[tuple[int, dict]], timeout: float) -> list[int]:
    layer = get_channel_layer()
    sent = []
    for event_id, message in messages:
        try:
            await asyncio.wait_for(
                layer.group_send(group_name(message["topic"]), {"type": "event.message", "event": message}),
                timeout=timeout,
            )
        except Exception as error:  # Redis away: the sweep sends the rest later.
            log.warning("event relay stopped at %s#%s: %r", message["topic"], message["seq"], error)
            break
        sent.append(event_id)
    return sent


def relay(messages: list[tuple[int, dict]]) -> int:
    """Send events to their groups and mark what was sent; returns how many went out."""
    if not messages:
        return 0
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        # Called from a thread that runs an event loop (async code must not block on Redis here): the
        # events stay in the outbox and the sweep sends them.
        return 0
    try:
        sent = async_to_sync(_send)(messages, settings.OUTBOX_RELAY_TIMEOUT)
    except Exception as error:
        log.warning("event relay failed: %r", error)
        return 0
    if sent:
        Event.objects.filter(pk__in=sent, sent_at__isnull=True).update(sent_at=timezone.now())
    return len(sent)


def outbox_sweep(*, min_age_seconds: float = 2.0, batch: int = 500) -> int:
    """Send events whose after-commit relay did not go out, oldest first; returns how many were sent."""
    cutoff = timezone.now() - timedelta(seconds=min_age_seconds)
    total = 0
    while True:
        with transaction.atomic():
            rows = Event.objects.filter(sent_at__isnull=True, created_at__lte=cutoff).order_by("id")
            if connection.features.has_select_for_update_skip_locked:
                rows = rows.select_for_update(skip_locked=True)
            pending = [(event.pk, event.as_message()) for event in rows[:batch]]
            sent = relay(pending)
        total += sent
        if sent < batch or sent < len(pending):
            return total


def events_prune(*, days: int | None = None) -> int:
    """Delete events older than the retention period; returns how many."""
    days = settings.EVENT_RETENTION_DAYS if days is None else days
    deleted, _ = Event.objects.filter(created_at__lt=timezone.now() - timedelta(days=days)).delete()
    return deleted
