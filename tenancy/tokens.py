"""API tokens: generation, hashing and the bearer check used by the API and the websocket.

A token reads ``lsk_<prefix>_<secret>``. The prefix identifies it in lists and logs; the whole token is
hashed with SHA-256 (the secret is 256 random bits, so a slow hash adds nothing) and only the digest is kept.
"""

import hashlib
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from tenancy.choices import TokenScope
from tenancy.models import ApiToken

TOKEN_PATTERN = re.compile(r"^lsk_(?P<prefix>[a-z0-9]{8})_(?P<secret>[A-Za-z0-9_-]{32,64})$")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class TokenError(Exception):
    """A bearer token that cannot authenticate; ``reason`` is one of malformed, unknown, revoked, expired, inactive."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def generate() -> tuple[str, str, str]:
    """A new token: (the token to show once, its prefix, its digest)."""
    prefix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
    raw = f"lsk_{prefix}_{secrets.token_urlsafe(32)}"
    return raw, prefix, digest(raw)


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def user_for_bearer(raw: str, *, method: str = "GET"):
    """The (user, token) a bearer token stands for, or TokenError saying why not. Scope is checked by the caller."""
    if not raw:
        raise TokenError("malformed", "Malformed Authorization header: expected 'Bearer <token>'.")
    if not TOKEN_PATTERN.match(raw):
        raise TokenError("malformed", "Malformed bearer token: Lockstep tokens look like lsk_xxxxxxxx_….")
    token = ApiToken.objects.select_related("user", "user__membership").filter(digest=digest(raw)).first()
    if token is None:
        raise TokenError("unknown", "Unknown token.")
    if token.revoked_at is not None:
        raise TokenError("revoked", "Token has been revoked.")
    now = timezone.now()
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenError("expired", "Token has expired.")
    if not token.user.is_active:
        raise TokenError("inactive", "The token's user is inactive.")
    resolution = timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION)
    if token.last_used_at is None or now - token.last_used_at >= resolution:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token.user, token


def scope_allows(token: ApiToken, method: str) -> bool:
    return token.scope == TokenScope.WRITE or method.upper() in SAFE_METHODS
