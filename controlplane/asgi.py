"""ASGI entry point: Django over HTTP and the one event consumer over websockets (served by uvicorn)."""

import os

import django
from asgiref.sync import sync_to_async
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
