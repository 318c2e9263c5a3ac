"""Hardening (issue 25): an open websocket outlives neither its credential nor its topics' permissions, and a
frame it cannot read is answered, not a dropped socket. The real ASGI stack and a real Redis channel layer."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane import consumers
from controlplane.asgi import application
from tenancy import services
from tenancy.choices import Role
from tenancy.models import ApiToken, Membership
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)
LOGOUT_URL = "/accounts/logout/"


@sync_to_async
def new_token(user):
    token, raw = services.token_create(actor=user, owner=user, name="ws", scope="read")
    return token, raw


async def open_socket(headers):
    communicator = WebsocketCommunicator(application, "/ws/events/", headers=headers)
    connected, code = await communicator.connect(timeout=5)
    assert connected, code
    hello = await communicator.receive_json_from(timeout=5)
    assert hello["type"] == "hello"
    return communicator


async def with_token(user):
    token, raw = await new_token(user)
    return token, await open_socket([(b"authorization", f"Bearer {raw}".encode())])


async def closed_with(communicator, code: int, timeout: float = 5.0) -> bool:
    """Read frames until the socket closes; True when it closed with ``code``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return False
        try:
            message = await communicator.receive_output(timeout=left)
        except TimeoutError:
            return False
        if message["type"] == "websocket.close":
            return message.get("code") == code


async def test_revoking_the_token_closes_its_socket_at_once(users, tenant_a):
    token, socket = await with_token(users["tenant-viewer"])
    _, other = await with_token(users["tenant-viewer"])  # the same user's other token stays open
    await sync_to_async(services.token_revoke)(actor=users["tenant-viewer"], token=token)
    assert await closed_with(socket, consumers.CLOSE_REVOKED)
    await other.send_json_to({"subscribe": [f"tenant-{tenant_a.pk}"]})
    assert (await other.receive_json_from(timeout=5))["type"] == "subscribed"
    await other.disconnect()


async def test_deactivating_the_user_closes_every_socket_of_it(users):
    viewer = users["tenant-viewer"]
    _, first = await with_token(viewer)
    _, second = await with_token(viewer)
    await sync_to_async(services.user_deactivate)(actor=users["tenant-admin"], user=viewer)
    assert await closed_with(first, consumers.CLOSE_REVOKED)
    assert await closed_with(second, consumers.CLOSE_REVOKED)


async def test_logging_out_closes_the_sessions_socket(users):
    viewer = users["tenant-viewer"]
    browser = Client()
    await sync_to_async(browser.force_login)(viewer)
    cookie = browser.cookies["sessionid"].value
    socket = await open_socket([(b"cookie", f"sessionid={cookie}".encode())])
    await sync_to_async(browser.post)(LOGOUT_URL)
    assert await closed_with(socket, consumers.CLOSE_REVOKED)


async def test_the_periodic_check_catches_what_no_event_announced(users, settings, monkeypatch):
    """An expiry, or a row changed behind the services: the next periodic check closes the socket."""
    settings.WS_REVALIDATE_SECONDS = 0.3
    token, socket = await with_token(users["tenant-viewer"])
    await sync_to_async(ApiToken.objects.filter(pk=token.pk).update)(revoked_at="2026-01-01T00:00:00Z")
    assert await closed_with(socket, consumers.CLOSE_REVOKED, timeout=5)


async def test_a_topic_no_longer_permitted_is_left(users, tenant_a, tenant_b, settings):
    settings.WS_REVALIDATE_SECONDS = 0.3
    mover = await sync_to_async(make_user)(Role.TENANT_VIEWER, tenant_a)
    _, socket = await with_token(mover)
    await socket.send_json_to({"subscribe": [f"tenant-{tenant_a.pk}"]})
    assert (await socket.receive_json_from(timeout=5))["topics"] == [f"tenant-{tenant_a.pk}"]
    await sync_to_async(Membership.objects.filter(user=mover).update)(
        tenant=tenant_b
    )  # moved to another tenant
    answer = await socket.receive_json_from(timeout=5)
    assert answer == {
        "type": "unsubscribed",
        "topics": [f"tenant-{tenant_a.pk}"],
        "reason": "no longer permitted",
    }
    await socket.disconnect()


@pytest.mark.parametrize(
    "frame",
    [
        {"text_data": "{not json"},
        {"bytes_data": b"\x00\x01binary"},
        {"text_data": "[" * 5000 + "]" * 5000},
        {"text_data": json.dumps({"subscribe": ["x" * 10] * 20_000})},
        {"text_data": "NaN"},
    ],
)
async def test_frames_it_cannot_read_get_an_error_and_the_socket_stays(users, frame):
    _, socket = await with_token(users["tenant-viewer"])
    await socket.send_to(**frame)
    answer = await socket.receive_json_from(timeout=5)
    assert answer["type"] == "error", answer
    await socket.send_json_to({"subscribe": ["fleet"]})
    assert (await socket.receive_json_from(timeout=5))["type"] == "subscribed"  # still open and serving
    await socket.disconnect()


async def test_a_subscribe_storm_is_bounded(users):
    """Many frames at once, each asking for many topics: every frame is answered, the socket holds at most
    MAX_TOPICS, and it still serves afterwards."""
    _, socket = await with_token(users["operator"])
    for n in range(50):
        await socket.send_json_to(
            {"subscribe": [f"job-{n * 10 + i}" for i in range(10)] + ["nonsense-topic"]}
        )
    answers = [await socket.receive_json_from(timeout=10) for _ in range(50)]
    assert all(a["type"] == "subscribed" and "nonsense-topic" in a["refused"] for a in answers)
    joined = {t for a in answers for t in a["topics"]}
    assert len(joined) <= consumers.MAX_TOPICS
    await socket.send_json_to({"unsubscribe": sorted(joined)})
    assert (await socket.receive_json_from(timeout=10))["type"] == "unsubscribed"
    await socket.disconnect()
