"""The one websocket consumer: ``/ws/events/``.

Clients send ``{"subscribe": ["fleet", "job-17"]}`` or ``{"unsubscribe": [...]}``; the consumer asks the
topic registry whether the user may see each topic before joining its group, and answers with what it
joined and what it refused, and each joined topic's head (its last sequence number):
``{"type": "subscribed", "topics": [...], "refused": [...], "heads": {"fleet": 123}}``. Events arrive as
``{"type": "event", "topic", "seq", "kind", "payload", "url", "created"}``.

An event can be committed, relayed and marked sent and still reach no socket (a relay in the second after
Redis returns, before this process has resubscribed its groups). So every ``HEADS_SECONDS`` the consumer
reads its topics' heads (one query) and, for a topic whose head is still above the last sequence number this
socket was sent or told of ``HEADS_GRACE_SECONDS`` later, sends ``{"type": "heads", "heads": {"job-7": 4}}``;
the client catches that topic up from ``/api/v1/events/``. Where every event arrived, nothing is sent.

One user (or token) holds at most ``WS_MAX_PER_USER`` sockets at once, counted across web processes in Redis
(a slot is a lease, renewed at each re-check, so a process that dies gives its slots back); the next is accepted
only to be told why and closed with ``CLOSE_TOO_MANY`` (4429).

A socket lives only as long as the credential it was opened with and the permissions of its topics: every
``WS_REVALIDATE_SECONDS`` it checks both again, and a revocation (the token revoked, the user deactivated, the
session logged out) reaches it at once through the user's revocation group. A credential that no longer holds
closes the socket with ``CLOSE_REVOKED``; a topic the user may no longer see is left, with
``{"type": "unsubscribed", "topics": [...], "reason": "no longer permitted"}``. A frame that is not a JSON
text (binary, malformed, too deep, too large) is answered with an error frame, and the socket stays open.
"""

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterable

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user_model

from controlplane import events, wsauth
from controlplane.selectors import topic_heads

log = logging.getLogger(__name__)

MAX_TOPICS = 200
CLOSE_UNAUTHENTICATED = 4401
CLOSE_REVOKED = (
    4403  # the credential the socket was opened with ended (revoked, expired, deactivated, logged out)
)
CLOSE_TOO_MANY = 4429  # the user already holds WS_MAX_PER_USER sockets open
MAX_FRAME_BYTES = 64 * 1024
# How often each connection compares its topics' heads with what it delivered (tests set it shorter).
HEADS_SECONDS = float(os.environ.get("LOCKSTEP_WS_HEADS_SECONDS", "5"))
# How long a head may run ahead of the socket before it is announced: longer than a relay from commit to
# socket takes, so an event that is on its way is not announced as well.
HEADS_GRACE_SECONDS = float(os.environ.get("LOCKSTEP_WS_HEADS_GRACE_SECONDS", "1"))


def _still_allowed(user, names: list[str]) -> set[str]:
    """The topics of ``names`` the user may still see, from the user's role as stored now (the socket's user
    carries the role, and its membership, cached from connect)."""
    fresh = get_user_model().objects.filter(pk=user.pk).first()
    return {name for name in names if fresh is not None and events.may_subscribe(fresh, name)}


class EventConsumer(AsyncJsonWebsocketConsumer):
    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stop_heads()

    async def connect(self):
        self.topics: set[str] = set()
        self.told: dict[str, int] = {}  # topic -> the highest sequence number this socket was sent or told of
        self.heads_task: asyncio.Task | None = None
        self.slot_user: int | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await asyncio.to_thread(wsauth.socket_slot_claim, user.pk, self.channel_name):
            # Accepted only to say why: a refused handshake carries no reason.
            await self.accept()
            detail = f"at most {settings.WS_MAX_PER_USER} open websockets per user: close one first"
            await self.send_json({"type": "error", "detail": detail})
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.slot_user = user.pk
        self.revocation_group = wsauth.revocation_group(user.pk)
        await self.channel_layer.group_add(self.revocation_group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "user": user.get_username()})
        self.heads_task = asyncio.create_task(self._watch_heads())
        self.credentials_task = asyncio.create_task(self._watch_credentials())

    async def disconnect(self, code):
        self._stop_heads()
        if getattr(self, "slot_user", None) is not None:
            await asyncio.to_thread(wsauth.socket_slot_release, self.slot_user, self.channel_name)
            self.slot_user = None
        group = getattr(self, "revocation_group", None)
        if group:
            await self.channel_layer.group_discard(group, self.channel_name)
            self.revocation_group = None
        for name in list(getattr(self, "topics", ())):
            await self.channel_layer.group_discard(events.group_name(name), self.channel_name)
        self.topics = set()

    def _stop_heads(self):
        for name in ("heads_task", "credentials_task"):
            task = getattr(self, name, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()
            setattr(self, name, None)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if text_data is None:
            await self.send_json({"type": "error", "detail": "send JSON text frames, not binary"})
            return
        if len(text_data) > MAX_FRAME_BYTES:
            await self.send_json({"type": "error", "detail": f"a frame is at most {MAX_FRAME_BYTES} bytes"})
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):  # malformed, or nested deeper than the parser goes
            await self.send_json({"type": "error", "detail": "a frame must be one JSON object"})
            return
        await self.receive_json(content)

    async def credentials_revoked(self, message):
        """A credential of this socket's user ended: close if it is this socket's, or if this one fails too."""
        if wsauth.revocation_matches(self.scope, message) or not await self._credential_valid():
            await self._close_revoked()

    async def _credential_valid(self) -> bool:
        try:
            return await database_sync_to_async(wsauth.credential_valid)(self.scope)
        except Exception as error:  # the database away: keep the socket, the next period checks again
            log.info("websocket credential not checked: %r", error)
            return True

    async def _close_revoked(self):
        with contextlib.suppress(Exception):
            await self.send_json(
                {"type": "error", "detail": "the credential of this connection is no longer valid"}
            )
        await self.close(code=CLOSE_REVOKED)

    async def _recheck_topics(self):
        if not self.topics:
            return
        names = sorted(self.topics)
        allowed = await database_sync_to_async(_still_allowed)(self.scope["user"], names)
        gone = [name for name in names if name not in allowed]
        for name in gone:
            await self.channel_layer.group_discard(events.group_name(name), self.channel_name)
            self.topics.discard(name)
            self.told.pop(name, None)
        if gone:
            await self.send_json({"type": "unsubscribed", "topics": gone, "reason": "no longer permitted"})

    async def _watch_credentials(self):
        while True:
            await asyncio.sleep(settings.WS_REVALIDATE_SECONDS)
            if not await self._credential_valid():
                await self._close_revoked()
                return
            await asyncio.to_thread(
                wsauth.socket_slot_claim, self.slot_user, self.channel_name
            )  # renew the lease
            try:
                await self._recheck_topics()
            except Exception as error:  # the database away: the next period checks again
                log.info("websocket topics not re-checked: %r", error)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict) or not ({"subscribe", "unsubscribe"} & content.keys()):
            await self.send_json(
                {"type": "error", "detail": 'send {"subscribe": [topics]} or {"unsubscribe": [topics]}'}
            )
            return
        for action in ("subscribe", "unsubscribe"):
            if action not in content:
                continue
            names = content[action]
            if (
                not isinstance(names, list)
                or not all(isinstance(n, str) for n in names)
                or len(names) > MAX_TOPICS
            ):
                await self.send_json(
                    {"type": "error", "detail": f"{action} takes a list of at most {MAX_TOPICS} topic names"}
                )
                continue
            if action == "subscribe":
                await self._subscribe(names)
            else:
                await self._unsubscribe(names)

    async def _subscribe(self, names: list[str]):
        allowed, refused = [], []
        for name in dict.fromkeys(names):
            if len(self.topics) >= MAX_TOPICS:
                refused.append(name)
            elif await database_sync_to_async(events.may_subscribe)(self.scope["user"], name):
                if name not in self.topics:
                    await self.channel_layer.group_add(events.group_name(name), self.channel_name)
                    self.topics.add(name)
                allowed.append(name)
            else:
                refused.append(name)
        heads = await self._read_heads(allowed) if allowed else {}
        for name, head in heads.items():
            self._tell(name, head)
        await self.send_json({"type": "subscribed", "topics": allowed, "refused": refused, "heads": heads})

    async def _unsubscribe(self, names: list[str]):
        removed = []
        for name in dict.fromkeys(names):
            if name in self.topics:
                await self.channel_layer.group_discard(events.group_name(name), self.channel_name)
                self.topics.discard(name)
                self.told.pop(name, None)
                removed.append(name)
        await self.send_json({"type": "unsubscribed", "topics": removed})

    async def dispatch(self, message):
        # Channels checks the process's database connections (a hop to a thread and back) before every message;
        # relaying an event touches no database, and there are many of them, so they go straight to the handler.
        if message.get("type") == "event.message":
            await self.event_message(message)
        else:
            await super().dispatch(message)

    async def event_message(self, message):
        event = message["event"]
        if event.get("topic") in self.topics:
            self._tell(event["topic"], event.get("seq") or 0)
            await self.send_json({"type": "event", **event})

    def _tell(self, name: str, seq: int) -> None:
        if seq > self.told.get(name, 0):
            self.told[name] = seq

    async def _read_heads(self, names: Iterable[str]) -> dict[str, int]:
        try:
            return await database_sync_to_async(topic_heads)(names)
        except Exception as error:  # the database away: the next period reads them again
            log.info("topic heads not read: %r", error)
            return {}

    def _ahead(self, heads: dict[str, int]) -> dict[str, int]:
        told, topics = self.told, self.topics
        return {name: head for name, head in heads.items() if name in topics and head > told.get(name, 0)}

    async def _watch_heads(self):
        while True:
            await asyncio.sleep(HEADS_SECONDS)
            if not self.topics:
                continue
            ahead = self._ahead(await self._read_heads(sorted(self.topics)))
            if not ahead:
                continue
            await asyncio.sleep(HEADS_GRACE_SECONDS)
            ahead = self._ahead(ahead)
            if ahead:
                for name, head in ahead.items():
                    self._tell(name, head)
                with contextlib.suppress(Exception):  # the socket went away: disconnect() ends this task
                    await self.send_json({"type": "heads", "heads": ahead})
