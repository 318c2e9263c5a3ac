"""Websocket authentication and origin checks.

A browser is authenticated by its session cookie and must come from an allowed origin (a page of another
site cannot open a socket with the user's cookie). Automation sends ``Authorization: Bearer <token>`` (or
``?token=`` where a client cannot set headers) and no Origin; the token check lives in tenancy and is
reached through a setting, so controlplane imports no app.
"""

from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.utils.module_loading import import_string


def _bearer_from_scope(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1").strip()
            if text.lower().startswith("bearer "):
                return text[7:].strip()
            return ""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if "token" in query:
        return query["token"][0]
    return None


@database_sync_to_async
def _user_for_token(raw: str):
    check = import_string(settings.LOCKSTEP_TOKEN_AUTHENTICATOR)
    try:
        user, token = check(raw, method="GET")
    except Exception:
        return AnonymousUser(), None
    return user, token


class TokenOrSessionAuthMiddleware:
    def __init__(self, app):
        self.app = app
        self.session_app = AuthMiddlewareStack(app)

    async def __call__(self, scope, receive, send):
        raw = _bearer_from_scope(scope)
        if raw is None:
            return await self.session_app(scope, receive, send)
        user, token = await _user_for_token(raw)
        return await self.app(dict(scope, user=user, token=token), receive, send)


class BrowserOriginValidator:
    """Checks the Origin of browser connections against ALLOWED_HOSTS; non-browser clients send none."""

    def __init__(self, app):
        self.app = app
        self.validated = AllowedHostsOriginValidator(app)

    async def __call__(self, scope, receive, send):
        if not any(name == b"origin" for name, _ in scope.get("headers", [])):
            return await self.app(scope, receive, send)
        return await self.validated(scope, receive, send)
