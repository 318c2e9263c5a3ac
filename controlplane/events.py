"""Live events: the topic registry, the one publish(), and the outbox relay.

A service calls ``publish()`` inside its transaction. That writes one Event row per topic, each with the
next sequence number of its topic, and registers an after-commit hook that relays the rows to the
channel-layer groups. A rolled-back transaction leaves no Event and sends nothing. What the relay could not
send (Redis away, the process killed) stays unsent and is sent by ``outbox_sweep`` on beat; clients
drop duplicates by sequence number and catch up from ``/api/v1/events/?topic=…&after=<seq>``.
"""

import asyncio
import collections
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from controlplane.access import Principal, principal
from controlplane.models import Event, TopicSequence
from controlplane.prepared import array_placeholder
from controlplane.prepared import cursor as prepared_cursor

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


def register_topic(
    prefix: str, *, keyed: bool, may_subscribe: Callable[[Principal, int | None], bool]
) -> None:
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


Item = tuple[Iterable[str], str, dict | None, str]


def publish(topics: Iterable[str], kind: str, payload: dict | None = None, url: str = "") -> list[Event]:
    """Record an event for each topic in the current transaction and relay it after commit."""
    return publish_many([(topics, kind, payload, url)])


_gathering = threading.local()


@contextlib.contextmanager
def gathered():
    """Within this block (inside a transaction), ``publish`` and ``publish_many`` only gather their events; the block's
    end writes them all with one ``publish_many``, in the order they were published. A decision that cordons 64
    nodes and records 64 actions then takes its topics' shared sequence rows once, at its end, and holds them only
    until COMMIT, instead of from its first event on (every other writer of ``fleet`` waits for them meanwhile); and
    writes and relays its events in one statement and one relay instead of one per event. The events of a savepoint
    rolled back within the block are dropped, as their on-commit relay would have been. Nested blocks gather into
    the outermost; an exception leaves nothing gathered."""
    if getattr(_gathering, "items", None) is not None or not connection.in_atomic_block:
        yield  # gathered by an outer block already; or no transaction to hold them: each publish writes at once
        return
    _gathering.items = []
    try:
        yield
        items, _gathering.items = _gathering.items, None
        # Django drops the on-commit callbacks registered inside a savepoint that rolls back: each gathered event
        # registered one (``_Kept``), so those still there are the events of work that stands.
        live = {id(func) for _, func, _ in connection.run_on_commit}
        publish_many([item for item, kept in items if id(kept) in live])
    finally:
        _gathering.items = None


class _Kept:
    """An on-commit callback that does nothing: its presence says its gathered event's savepoint stands."""

    def __call__(self) -> None:
        pass


def publish_many(items: Iterable[Item]) -> list[Event]:
    """Record several events — each ``(topics, kind, payload, url)`` — in the current transaction, and relay
    them together after commit. On PostgreSQL this is one statement whatever the number of events and topics.
    Inside ``gathered()`` they are written at the block's end (and nothing is returned)."""
    if getattr(_gathering, "items", None) is not None:
        for topics, kind, payload, url in items:
            names = list(topics)
            for name in names:
                parse_topic(name)  # an unknown topic is refused where it is published
            kept = _Kept()
            transaction.on_commit(kept)
            _gathering.items.append(((names, kind, payload, url), kept))
        return []
    rows: list[tuple[str, int]] = []  # (topic, index of its item), in publishing order
    prepared = []
    for index, (topics, kind, payload, url) in enumerate(items):
        names = list(dict.fromkeys(topics))
        for name in names:
            parse_topic(name)
        rows += [(name, index) for name in names]
        prepared.append((kind, payload or {}, url))
    if not rows:
        return []
    # Each topic's rows are numbered in publishing order up to its new last sequence number: ``back`` is how far
    # below that number a row sits. Sequence rows are bumped in topic order, so two transactions never wait on
    # each other in a cycle.
    counts = collections.Counter(name for name, _ in rows)
    seen: collections.Counter = collections.Counter()
    back = []
    for name, _ in rows:
        seen[name] += 1
        back.append(counts[name] - seen[name])
    if connection.vendor == "postgresql":
        events = _insert_postgresql(rows, back, counts, prepared)
    else:
        # no savepoint: the two statements stand or fall with the caller's transaction (one of their own outside one)
        with transaction.atomic(savepoint=False):
            last = _next_seqs(counts)
            events = Event.objects.bulk_create(
                [
                    Event(
                        topic=name,
                        seq=last[name] - down,
                        kind=prepared[i][0],
                        payload=prepared[i][1],
                        url=prepared[i][2],
                    )
                    for (name, i), down in zip(rows, back, strict=True)
                ]
            )
    if settings.OUTBOX_RELAY:
        messages = [(event.pk, event.as_message()) for event in events]
        transaction.on_commit(lambda: relay(messages))
    return events


def _next_seqs(counts: collections.Counter) -> dict[str, int]:
    """Add each topic's count to its sequence, in topic order, in one statement; returns each new last number."""
    table, topics = TopicSequence._meta.db_table, sorted(counts)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (topic, last_seq) VALUES {', '.join(['(%s, %s)'] * len(topics))} "
            f"ON CONFLICT (topic) DO UPDATE SET last_seq = {table}.last_seq + EXCLUDED.last_seq "
            f"RETURNING topic, last_seq",
            [value for name in topics for value in (name, counts[name])],
        )
        return dict(cursor.fetchall())


def _insert_postgresql(
    rows: list[tuple[str, int]],
    back: list[int],
    counts: collections.Counter,
    prepared: list[tuple[str, dict, str]],
) -> list[Event]:
    """Bump the topics' sequence rows and insert the events, in one round trip. Each payload is sent once,
    however many topics it goes to."""
    topics = sorted(counts)
    values = ", ".join(["(%s::int, %s::varchar, %s::jsonb, %s::varchar)"] * len(prepared))
    sequence, event = TopicSequence._meta.db_table, Event._meta.db_table
    now = timezone.now()
    params: list = [topics, [counts[name] for name in topics]]
    for i, (kind, payload, url) in enumerate(prepared):
        params += [i, kind, json.dumps(payload), url]
    params += [[name for name, _ in rows], back, [i for _, i in rows], now]
    with prepared_cursor(len(params)) as cursor:
        a = array_placeholder(cursor)
        sql = (
            f"WITH s AS (INSERT INTO {sequence} AS q (topic, last_seq) "
            f"SELECT t.topic, t.n FROM unnest({a}::varchar[], {a}::bigint[]) AS t(topic, n) ORDER BY t.topic "
            f"ON CONFLICT (topic) DO UPDATE SET last_seq = q.last_seq + EXCLUDED.last_seq RETURNING q.topic, q.last_seq), "
            f"p(i, kind, payload, url) AS (VALUES {values}), "
            f"r AS (SELECT * FROM unnest({a}::varchar[], {a}::bigint[], {a}::int[]) AS r(topic, back, i)) "
            f"INSERT INTO {event} (topic, seq, kind, payload, url, created_at) "
            f"SELECT r.topic, s.last_seq - r.back, p.kind, p.payload, p.url, %s "
            f"FROM r JOIN s ON s.topic = r.topic JOIN p ON p.i = r.i RETURNING id, topic, seq"
        )
        cursor.execute(sql, params)
        inserted = {(topic, seq): pk for pk, topic, seq in cursor.fetchall()}
    last: dict[str, int] = {}
    for topic, seq in inserted:
        last[topic] = max(seq, last.get(topic, 0))
    events = []
    for (name, i), down in zip(rows, back, strict=True):
        seq = last[name] - down
        kind, payload, url = prepared[i]
        events.append(
            Event(
                pk=inserted[(name, seq)],
                topic=name,
                seq=seq,
                kind=kind,
                payload=payload,
                url=url,
                created_at=now,
            )
        )
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


_publishers: dict[tuple[str, float], redis.Redis] = {}


def _pubsub_publisher() -> tuple[redis.Redis, str] | None:
    """A plain Redis client and the group-channel prefix, when the channel layer is channels_redis' pub/sub
    layer on one host: its ``group_send`` is one PUBLISH of the serialised message to
    ``<prefix>__group__<group>``, which a pipeline does for a whole batch in one round trip, without an event
    loop. Other layers (and sharded ones) take the ``async_to_sync`` path."""
    config = settings.CHANNEL_LAYERS["default"]
    hosts = config.get("CONFIG", {}).get("hosts") or []
    if (
        config["BACKEND"] != "channels_redis.pubsub.RedisPubSubChannelLayer"
        or len(hosts) != 1
        or not isinstance(hosts[0], str)
    ):
        return None
    key = (hosts[0], settings.OUTBOX_RELAY_TIMEOUT)
    client = _publishers.get(key)
    if client is None:
        client = _publishers[key] = redis.Redis.from_url(
            hosts[0], socket_timeout=key[1], socket_connect_timeout=key[1]
        )
    return client, config["CONFIG"].get("prefix", "asgi")


def _publish_pipelined(client: redis.Redis, prefix: str, messages: list[tuple[int, dict]]) -> list[int]:
    layer = get_channel_layer()
    pipe = client.pipeline(transaction=False)
    for _event_id, message in messages:
        pipe.publish(
            f"{prefix}__group__{group_name(message['topic'])}",
            layer.serialize({"type": "event.message", "event": message}),
        )
    try:
        pipe.execute()
    except redis.RedisError as error:  # Redis away: the sweep sends them later (clients drop duplicates).
        log.warning("event relay of %d events failed: %r", len(messages), error)
        return []
    return [event_id for event_id, _ in messages]


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
    publisher = _pubsub_publisher()
    try:
        if publisher is not None:
            sent = _publish_pipelined(*publisher, messages)
        else:
            sent = async_to_sync(_send)(messages, settings.OUTBOX_RELAY_TIMEOUT)
    except Exception as error:
        log.warning("event relay failed: %r", error)
        return 0
    if sent:
        try:
            _mark_sent(sent)
        except DatabaseError as error:
            # The relay runs after COMMIT: the change and its events are stored, so a database gone away now
            # must not turn the request or task that made them into an error (an API client would retry a
            # report that was stored). Unmarked, the sweep sends them again; clients drop the duplicates.
            log.warning("relayed %d events but could not mark them sent: %r", len(sent), error)
    return len(sent)


def _mark_sent(ids: list[int]) -> None:
    """Mark relayed events sent (every relay does this, so on PostgreSQL it is one plain statement, not a query
    compiled by the ORM each time)."""
    if connection.vendor != "postgresql":
        Event.objects.filter(pk__in=ids, sent_at__isnull=True).update(sent_at=timezone.now())
        return
    with prepared_cursor() as cursor:
        cursor.execute(
            f"UPDATE {Event._meta.db_table} SET sent_at = %s "
            f"WHERE id = ANY({array_placeholder(cursor)}::bigint[]) AND sent_at IS NULL",
            [timezone.now(), list(ids)],
        )


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
