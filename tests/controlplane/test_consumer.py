"""The websocket consumer with the real ASGI stack and a real Redis channel layer."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.db import transaction

from controlplane import events
from controlplane.asgi import application
from controlplane.models import Event
from tests.conftest import token_header

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
    await publish_committed(other)           # not subscribed (and not allowed)
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


async def test_event_published_while_redis_is_down_arrives_after_it_returns(users, tenant_a, private_redis, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [private_redis.url]}}}
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
