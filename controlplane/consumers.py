"""The one websocket consumer: ``/ws/events/``.

Clients send ``{"subscribe": ["fleet", "job-17"]}`` or ``{"unsubscribe": [...]}``; the consumer asks the
topic registry whether the user may see each topic before joining its group, and answers with what it
joined and what it refused. Events arrive as ``{"type": "event", "topic", "seq", "kind", "payload", "url",
"created"}``.
"""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from controlplane import events

MAX_TOPICS = 200
CLOSE_UNAUTHENTICATED = 4401


class EventConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.topics: set[str] = set()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.accept()
        await self.send_json({"type": "hello", "user": user.get_username()})

    async def disconnect(self, code):
        for name in list(getattr(self, "topics", ())):
            await self.channel_layer.group_discard(events.group_name(name), self.channel_name)
        self.topics = set()

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict) or not ({"subscribe", "unsubscribe"} & content.keys()):
            await self.send_json({"type": "error", "detail": 'send {"subscribe": [topics]} or {"unsubscribe": [topics]}'})
            return
        for action in ("subscribe", "unsubscribe"):
            if action not in content:
                continue
            names = content[action]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(names) > MAX_TOPICS:
                await self.send_json({"type": "error", "detail": f"{action} takes a list of at most {MAX_TOPICS} topic names"})
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
        await self.send_json({"type": "subscribed", "topics": allowed, "refused": refused})

    async def _unsubscribe(self, names: list[str]):
        removed = []
        for name in dict.fromkeys(names):
            if name in self.topics:
                await self.channel_layer.group_discard(events.group_name(name), self.channel_name)
                self.topics.discard(name)
                removed.append(name)
        await self.send_json({"type": "unsubscribed", "topics": removed})

    async def event_message(self, message):
        event = message["event"]
        if event.get("topic") in self.topics:
            await self.send_json({"type": "event", **event})
