"""ASGI entry point: Django over HTTP and the one event consumer over websockets (served by uvicorn)."""

import asyncio
import os
import weakref
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Django runs each request's sync code on a thread of its own under ASGI: pool the connections (settings).
os.environ.setdefault("DATABASE_POOL_SIZE", "4")


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler, with the middleware chain and the view run as one synchronous call.

    Every view and middleware here is synchronous. Django's async mode runs them anyway, but hops between the
    event loop and the request's thread at each boundary: into a middleware that can run either way, back for
    the next, once more for the view, again for each async-capable middleware's response hook. Here the request
    goes to its thread once, runs the chain as under WSGI, and comes back with the response; reading the body,
    the signals, the disconnect watch and sending stay Django's."""

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    # Django gives every request a thread-sensitive context of its own, and so a new thread, started and joined per
    # request (a tenth of the web process's samples at 50 fault reports a second, bench/fault_latency.py under
    # py-spy). Here a request takes one of a fixed set of long-lived threads ("lanes") for its synchronous code
    # instead, and gives it back when answered: its sync code still runs on one thread, as Django requires.
    LANES = max(4, 2 * int(os.environ.get("DATABASE_POOL_SIZE") or 4))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)  # Django's own refusal
        lanes = self._lanes()
        executor = await lanes.get()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            lanes.put_nowait(executor)

    def _lanes(self) -> asyncio.Queue:
        """The lanes of the running event loop (made on its first request: a queue belongs to one loop)."""
        loop = asyncio.get_running_loop()
        by_loop = self.__dict__.setdefault("_lanes_by_loop", weakref.WeakKeyDictionary())
        lanes = by_loop.get(loop)
        if lanes is None:
            lanes = by_loop[loop] = asyncio.Queue()
            for n in range(self.LANES):
                lanes.put_nowait(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"django-lane-{n}"))
        return lanes


django.setup(set_prefix=False)
django_asgi_app = SyncChainASGIHandler()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from controlplane.routing import websocket_urlpatterns  # noqa: E402
from controlplane.wsauth import BrowserOriginValidator, TokenOrSessionAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": BrowserOriginValidator(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
