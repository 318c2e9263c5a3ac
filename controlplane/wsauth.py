"""Websocket authentication and origin checks.

A browser is authenticated by its session cookie and must come from an allowed origin (a page of another
site cannot open a socket with the user's cookie). Automation sends ``Authorization: Bearer <token>`` (or
``?token=`` where a client cannot set headers) and no Origin; the token check lives in tenancy and is
reached through a setting, so controlplane imports no app.
"""

import logging
from importlib import import_module
from urllib.parse import parse_qs

from asgiref.sync import async_to_sync
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.security.websocket import AllowedHostsOriginValidator
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string

log = logging.getLogger(__name__)


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


# --- re-validation: an open socket lives only as long as the credential it was opened with -------------------------


def revocation_group(user_id: int) -> str:
    """The channel-layer group every socket of one user joins to hear that a credential of the user ended (not a
    topic: it carries no events, only the order to check again)."""
    return f"lockstep.credentials.user-{int(user_id)}"


def credentials_revoked(*, user_id: int, token_id: int | None = None, session_key: str | None = None) -> None:
    """After commit, tell the user's open sockets that a credential ended: the socket opened with ``token_id`` or
    ``session_key`` closes; every other socket of the user checks its own credential again (a deactivated user's
    all fail). A channel layer that is away is logged: the periodic re-check closes the sockets instead."""
    message = {"type": "credentials.revoked", "token_id": token_id, "session_key": session_key}

    def send():
        try:
            async_to_sync(get_channel_layer().group_send)(revocation_group(user_id), message)
        except Exception as error:  # Redis away: WS_REVALIDATE_SECONDS bounds how long a socket outlives it
            log.warning("revocation of user %s not sent to its sockets: %r", user_id, error)

    transaction.on_commit(send)


def credential_valid(scope) -> bool:
    """Is the credential this socket was opened with still good: the user active, the token neither revoked nor
    expired, the session not logged out (and not from before a password change)?"""
    user = scope.get("user")
    if user is None or not user.is_authenticated:
        return False
    current = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
    if current is None:
        return False
    token = scope.get("token")
    if token is not None:
        fresh = type(token).objects.filter(pk=token.pk).first()
        return fresh is not None and fresh.is_active
    session = scope.get("session")
    key = getattr(session, "session_key", None)
    if not key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    if str(store.get(SESSION_KEY)) != str(current.pk):
        return False
    stored_hash = store.get(HASH_SESSION_KEY)
    return bool(stored_hash) and constant_time_compare(stored_hash, current.get_session_auth_hash())


def revocation_matches(scope, message: dict) -> bool:
    """Does a revocation message name this socket's own credential?"""
    token = scope.get("token")
    if message.get("token_id") is not None and token is not None and token.pk == message["token_id"]:
        return True
    key = getattr(scope.get("session"), "session_key", None)
    return bool(message.get("session_key")) and key == message["session_key"]


def _logged_out(sender, request=None, user=None, **_):
    if user is not None and getattr(user, "pk", None):
        credentials_revoked(
            user_id=user.pk, session_key=getattr(getattr(request, "session", None), "session_key", None)
        )


def connect_signals() -> None:
    """Logging out ends the session's sockets (called from the app's ready())."""
    from django.contrib.auth.signals import user_logged_out

    user_logged_out.connect(_logged_out, dispatch_uid="lockstep-ws-logout")


# --- how many sockets one user holds ---------------------------------------------------------------------------------

# Claim a slot atomically: drop the leases that ran out (a process that died), then admit the socket only while the
# user holds fewer than the cap. KEYS[1]: the user's slots; ARGV: now, lease end, the socket's channel, cap, lease.
_CLAIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[5])))
return 1
"""
_slots_client = None


def _slots():
    """The Redis client (its pool is thread-safe) and the claim script, made once per process."""
    global _slots_client
    if _slots_client is None:
        import redis

        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        _slots_client = (client, client.register_script(_CLAIM))
    return _slots_client


def _slot_key(user_id: int) -> str:
    return f"lockstep:ws-slots:user-{int(user_id)}"


def _lease_seconds() -> float:
    """A slot is renewed at every credential re-check (WS_REVALIDATE_SECONDS) and lapses after three missed."""
    return 3 * float(settings.WS_REVALIDATE_SECONDS)


def socket_slot_claim(user_id: int, channel_name: str) -> bool:
    """Take (or renew) one of the user's WS_MAX_PER_USER socket slots, in every web process at once (Redis): False
    when the user holds them all. Redis away: True (the channel layer is Redis too, and its loss is reported)."""
    import time

    now = time.time()
    try:
        _, claim = _slots()
        return bool(
            claim(
                keys=[_slot_key(user_id)],
                args=[now, now + _lease_seconds(), channel_name, settings.WS_MAX_PER_USER, _lease_seconds()],
            )
        )
    except Exception as error:  # Redis away or refusing: the cap steps aside, logged
        log.warning("websocket slot of user %s not counted: %r", user_id, error)
        return True


def socket_slot_release(user_id: int, channel_name: str) -> None:
    """Give the socket's slot back (it closed)."""
    try:
        _slots()[0].zrem(_slot_key(user_id), channel_name)
    except Exception as error:  # the lease runs out by itself
        log.info("websocket slot of user %s not released: %r", user_id, error)
