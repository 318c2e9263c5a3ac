"""API tokens: generation, hashing and the bearer check used by the API and the websocket.

A token reads ``lsk_<prefix>_<secret>``. The prefix identifies it in lists and logs; the whole token is
hashed with SHA-256 (the secret is 256 random bits, so a slow hash adds nothing) and only the digest is kept.
"""

import functools
import hashlib
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from tenancy.choices import TokenScope
from tenancy.models import ApiToken, Membership

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


@functools.cache
def _token_query() -> tuple[str, list[tuple[type, list[str], list]]]:
    """The statement that reads a token, its user and the user's membership, and the models and field names its
    columns fill, in order: built once, from the models' fields."""
    from django.contrib.auth import get_user_model

    quote = connection.ops.quote_name
    parts = [(ApiToken, "t"), (get_user_model(), "u"), (Membership, "m")]
    columns, layout = [], []
    for model, alias in parts:
        fields = model._meta.concrete_fields
        columns += [f"{alias}.{quote(field.column)}" for field in fields]
        layout.append((model, [field.attname for field in fields], [field.get_col(alias) for field in fields]))
    user_table, membership_table = parts[1][0]._meta.db_table, Membership._meta.db_table
    sql = (f"SELECT {', '.join(columns)} FROM {quote(ApiToken._meta.db_table)} t "
           f"JOIN {quote(user_table)} u ON u.{quote('id')} = t.{quote('user_id')} "
           f"LEFT JOIN {quote(membership_table)} m ON m.{quote('user_id')} = u.{quote('id')} "
           f"WHERE t.{quote('digest')} = %s")
    return sql, layout


def _token_by_digest(token_digest: str) -> ApiToken | None:
    """The token with this digest, with its user and the user's membership (or its absence) loaded, as
    ``select_related("user", "user__membership")`` would: in one plain statement, since every API request and
    websocket authenticates through here and compiling the three-table query cost more than running it."""
    sql, layout = _token_query()
    with connection.cursor() as cursor:
        cursor.execute(sql, [token_digest])
        row = cursor.fetchone()
    if row is None:
        return None
    loaded, start = [], 0
    for model, names, cols in layout:
        values = list(row[start:start + len(names)])
        start += len(names)
        # The database's values as Python's, as the ORM converts them (SQLite's datetimes, for one).
        for i, col in enumerate(cols):
            for convert in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
                values[i] = convert(values[i], col, connection)
        loaded.append(model.from_db(connection.alias, names, values) if values[0] is not None else None)
    token, user, membership = loaded
    token.user = user
    type(user).membership.related.set_cached_value(user, membership)
    if membership is not None:
        Membership.user.field.set_cached_value(membership, user)
    return token


def user_for_bearer(raw: str, *, method: str = "GET"):
    """The (user, token) a bearer token stands for, or TokenError saying why not. Scope is checked by the caller."""
    if not raw:
        raise TokenError("malformed", "Malformed Authorization header: expected 'Bearer <token>'.")
    if not TOKEN_PATTERN.match(raw):
        raise TokenError("malformed", "Malformed bearer token: Lockstep tokens look like lsk_xxxxxxxx_….")
    token = _token_by_digest(digest(raw))
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
