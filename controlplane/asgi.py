"""ASGI entry point: Django over HTTP and the one event consumer over websockets (served by uvicorn)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Django runs each request's sync code on a thread of its own under ASGI: pool the connections (settings).
os.environ.setdefault("DATABASE_POOL_SIZE", "4")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from controlplane.routing import websocket_urlpatterns  # noqa: E402
from controlplane.wsauth import BrowserOriginValidator, TokenOrSessionAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": BrowserOriginValidator(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
