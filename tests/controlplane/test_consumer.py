"""The websocket consumer with the real ASGI stack and a real Redis channel layer."""

import asyncio
import time
from unittest import mock

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane import consumers, events
from controlplane.asgi import application
from controlplane.models import Event
from tests.support.factories import token_header

pytestmark = pytest.mark.django_db(transaction=True)


async def connect(user=None, raw_header=None):
    headers = []
    if user is not None:
        header = await sync_to_async(token_header)(user, "read")
        headers = [(b"authorization", header["HTTP_AUTHORIZATION"].encode())]
    if raw_header is not None:
        headers = [(b"authorization", raw_header.encode())]
    communicator = WebsocketCommunicator(application, "/ws/events/", headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, connected, code


async def subscribe(communicator, *topics):
    await communicator.send_json_to({"subscribe": list(topics)})
    return await communicator.receive_json_from(timeout=5)


@sync_to_async
def publish_committed(topic, kind="thing.happened", payload=None):
    with transaction.atomic():
        events.publish([topic], kind, payload or {})


def _relayed_to_no_socket(messages):
    """What the relay does in the second after Redis returns, before the web process has resubscribed its
    groups: Redis takes the messages, nobody is listening, and the rows are marked sent."""
    Event.objects.filter(pk__in=[pk for pk, _ in messages]).update(sent_at=timezone.now())
    return len(messages)


@sync_to_async
def publish_lost(topic, kind="thing.lost", payload=None):
    """Commit an event whose relay reached no socket (and which the sweep will not send again)."""
    with mock.patch.object(events, "relay", _relayed_to_no_socket), transaction.atomic():
        [event] = events.publish([topic], kind, payload or {})
    assert Event.objects.get(pk=event.pk).sent_at is not None
    return event.seq


@sync_to_async
def publish_rolled_back(topic):
    try:
        with transaction.atomic():
            events.publish([topic], "never.happened")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass


async def test_anonymous_and_bad_tokens_are_closed():
    communicator, connected, code = await connect()
    assert not connected and code == 4401
    communicator, connected, code = await connect(raw_header="Bearer lsk_abcdefgh_" + "y" * 43)
    assert not connected and code == 4401


async def test_user_joins_what_it_may_see_and_gets_events_after_commit_only(users, tenant_a, tenant_b):
    communicator, connected, _ = await connect(users["tenant-viewer"])
    assert connected
    hello = await communicator.receive_json_from()
    assert hello["type"] == "hello"
    own, other = f"tenant-{tenant_a.pk}", f"tenant-{tenant_b.pk}"
    reply = await subscribe(communicator, own, other, "fleet", "garbage!")
    assert reply["topics"] == [own]
    assert sorted(reply["refused"]) == sorted([other, "fleet", "garbage!"])

    await publish_rolled_back(own)
    await publish_committed(other)  # not subscribed (and not allowed)
    await publish_committed(own, payload={"n": 1})
    message = await communicator.receive_json_from(timeout=5)
    assert message["type"] == "event" and message["topic"] == own
    assert message["payload"] == {"n": 1} and message["seq"] == 1
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()


async def test_unsubscribe_stops_events_and_bad_messages_get_errors(users, tenant_a):
    communicator, _, _ = await connect(users["tenant-admin"])
    await communicator.receive_json_from()
    own = f"tenant-{tenant_a.pk}"
    await subscribe(communicator, own)
    await communicator.send_json_to({"unsubscribe": [own]})
    assert (await communicator.receive_json_from())["topics"] == [own]
    await publish_committed(own)
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.send_json_to({"subscribe": "fleet"})
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.send_json_to(["nope"])
    assert (await communicator.receive_json_from())["type"] == "error"
    await communicator.disconnect()


async def test_event_published_while_redis_is_down_arrives_after_it_returns(
    users, tenant_a, private_redis, settings
):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [private_redis.url]},
        }
    }
    channel_layers.backends.clear()
    own = f"tenant-{tenant_a.pk}"

    await sync_to_async(private_redis.stop)()
    await publish_committed(own, payload={"while": "redis down"})
    unsent = await sync_to_async(lambda: list(Event.objects.filter(topic=own, sent_at__isnull=True)))()
    assert len(unsent) == 1, "the relay could not send, so the event must wait in the outbox"

    await sync_to_async(private_redis.start)()
    channel_layers.backends.clear()
    communicator, connected, _ = await connect(users["tenant-viewer"])
    assert connected
    await communicator.receive_json_from()
    await subscribe(communicator, own)
    sent = await sync_to_async(events.outbox_sweep)(min_age_seconds=0)
    assert sent == 1
    message = await communicator.receive_json_from(timeout=5)
    assert message["payload"] == {"while": "redis down"} and message["seq"] == 1
    await communicator.disconnect()


async def test_many_events_arrive_in_sequence_order(users, tenant_a):
    communicator, _, _ = await connect(users["provider-admin"])
    await communicator.receive_json_from()
    own = f"tenant-{tenant_a.pk}"
    await subscribe(communicator, own, "fleet")
    for n in range(20):
        await publish_committed(own, payload={"n": n})
    seqs = [(await communicator.receive_json_from(timeout=5))["seq"] for _ in range(20)]
    assert seqs == list(range(1, 21))
    await asyncio.sleep(0)
    await communicator.disconnect()


@pytest.fixture
def quick_heads(monkeypatch):
    """Heads every 0.3 s, announced after 0.2 s (5 s and 1 s in production)."""
    monkeypatch.setattr(consumers, "HEADS_SECONDS", 0.3)
    monkeypatch.setattr(consumers, "HEADS_GRACE_SECONDS", 0.2)


async def test_subscribe_reply_carries_the_heads_of_the_joined_topics(users, tenant_a, tenant_b):
    own, other = f"tenant-{tenant_a.pk}", f"tenant-{tenant_b.pk}"
    for _ in range(3):
        await publish_committed(own)
    await publish_committed(other)
    communicator, _, _ = await connect(users["tenant-viewer"])
    await communicator.receive_json_from()
    reply = await subscribe(communicator, own, other, "fleet", f"tenant-{tenant_a.pk + 1000}")
    assert reply["topics"] == [own]
    assert reply["heads"] == {own: 3}, "the heads of refused topics are not told"
    communicator2, _, _ = await connect(users["provider-admin"])
    await communicator2.receive_json_from()
    reply = await subscribe(communicator2, own, "fleet")
    assert reply["heads"] == {own: 3, "fleet": 0}
    await communicator.disconnect()
    await communicator2.disconnect()


async def test_event_whose_relay_reached_no_socket_is_announced_by_the_next_heads(
    users, tenant_a, tenant_b, quick_heads
):
    own, other = f"tenant-{tenant_a.pk}", f"tenant-{tenant_b.pk}"
    communicator, _, _ = await connect(users["provider-admin"])
    await communicator.receive_json_from()
    reply = await subscribe(communicator, own, "fleet")
    assert reply["heads"] == {own: 0, "fleet": 0}
    await publish_committed(own, payload={"n": 1})
    assert (await communicator.receive_json_from(timeout=5))["seq"] == 1
    assert await communicator.receive_nothing(timeout=1.0), "every event arrived: no heads"

    seq = await publish_lost(own)
    await publish_lost(other)  # not subscribed: never announced
    lost_at = time.monotonic()
    heads = await communicator.receive_json_from(timeout=5)
    waited = time.monotonic() - lost_at
    assert heads == {"type": "heads", "heads": {own: seq}} and seq == 2
    assert 0.2 <= waited < 0.3 + 0.2 + 1.0, waited
    assert await communicator.receive_nothing(timeout=1.0), "a head is announced once"

    # Lost again, then a later event gets through: the client sees the gap by itself, no heads needed.
    await publish_lost(own)
    await publish_committed(own)
    assert (await communicator.receive_json_from(timeout=5))["seq"] == 4
    assert await communicator.receive_nothing(timeout=1.0)

    # An unsubscribed topic is no longer watched.
    await communicator.send_json_to({"unsubscribe": [own]})
    assert (await communicator.receive_json_from())["topics"] == [own]
    await publish_lost(own)
    assert await communicator.receive_nothing(timeout=1.0)
    await publish_lost("fleet")
    assert (await communicator.receive_json_from(timeout=5))["heads"] == {"fleet": 1}
    await communicator.disconnect()


async def test_tenant_is_never_told_heads_of_topics_it_may_not_see(users, tenant_a, tenant_b, quick_heads):
    own, other = f"tenant-{tenant_a.pk}", f"tenant-{tenant_b.pk}"
    communicator, _, _ = await connect(users["tenant-viewer"])
    await communicator.receive_json_from()
    reply = await subscribe(communicator, own, other, "fleet")
    assert reply["refused"] == [other, "fleet"] and reply["heads"] == {own: 0}
    await publish_lost(other)
    await publish_lost("fleet")
    assert await communicator.receive_nothing(timeout=1.5)
    await publish_lost(other)
    seq = await publish_lost(own)
    message = await communicator.receive_json_from(timeout=5)
    assert message == {"type": "heads", "heads": {own: seq}}
    assert await communicator.receive_nothing(timeout=1.0)
    await communicator.disconnect()


async def test_heads_cost_one_query_per_period_and_none_without_topics(
    users, tenant_a, quick_heads, monkeypatch
):
    calls = []
    real = consumers.topic_heads

    def counted(names):
        with CaptureQueriesContext(connection) as queries:
            heads = real(names)
        calls.append((time.monotonic(), len(names), len(queries)))
        return heads

    monkeypatch.setattr(consumers, "topic_heads", counted)
    communicator, _, _ = await connect(users["provider-admin"])
    await communicator.receive_json_from()
    await asyncio.sleep(1.0)
    assert calls == [], "nothing subscribed: no query"
    names = ["fleet", *[f"tenant-{tenant_a.pk + n}" for n in range(50)]]
    reply = await subscribe(communicator, *names)
    assert len(reply["heads"]) == 51
    started = time.monotonic()
    await asyncio.sleep(1.5)
    await communicator.disconnect()
    stopped = time.monotonic()
    periodic = [call for call in calls if call[0] > started]
    assert calls[0][1:] == (51, 1), "the subscribe reply reads all heads in one query"
    assert 3 <= len(periodic) <= 6, periodic  # 1.5 s at one read per 0.3 s
    assert all(call[1:] == (51, 1) for call in periodic)
    await asyncio.sleep(0.7)
    assert all(call[0] <= stopped for call in calls), "the watch ends with the connection"
