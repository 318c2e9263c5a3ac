"""Bearer tokens: how one is made, how it looks and how it is hashed, for every kind of them (API ``lsk``, agent
``lsa``, job ``lsj``, launcher ``lsl``), and the API token's one-statement lookup.

A token reads ``<kind>_<prefix>_<secret>``. The prefix identifies it in lists and logs; the whole token is
hashed with SHA-256 (the secret is 256 random bits, so a slow hash adds nothing) and only the digest is kept.
The checks that turn a token into a request's user are in tenancy.authentication; the writes in tenancy.services.
"""

import functools
import hashlib
import re
import secrets

from django.db import connection

from controlplane.prepared import cursor as prepared_cursor
from tenancy.choices import TokenScope
from tenancy.models import ApiToken, Membership

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PREFIX_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


class TokenError(Exception):
    """A bearer token that cannot authenticate; ``reason`` is one of malformed, unknown, revoked, expired, inactive."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def generate(kind: str) -> tuple[str, str, str]:
    """A new token of ``kind`` (``lsk``…): (the token to show once, its prefix, its digest)."""
    prefix = "".join(secrets.choice(PREFIX_ALPHABET) for _ in range(8))
    raw = f"{kind}_{prefix}_{secrets.token_urlsafe(32)}"
    return raw, prefix, digest(raw)


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@functools.cache
def shape(kind: str) -> re.Pattern:
    """What a well-formed token of ``kind`` looks like."""
    return re.compile(rf"^{kind}_(?P<prefix>[a-z0-9]{{8}})_(?P<secret>[A-Za-z0-9_-]{{32,64}})$")


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
        layout.append(
            (model, [field.attname for field in fields], [field.get_col(alias) for field in fields])
        )
    user_table, membership_table = parts[1][0]._meta.db_table, Membership._meta.db_table
    sql = (
        f"SELECT {', '.join(columns)} FROM {quote(ApiToken._meta.db_table)} t "
        f"JOIN {quote(user_table)} u ON u.{quote('id')} = t.{quote('user_id')} "
        f"LEFT JOIN {quote(membership_table)} m ON m.{quote('user_id')} = u.{quote('id')} "
        f"WHERE t.{quote('digest')} = %s"
    )
    return sql, layout


def api_token_by_digest(token_digest: str) -> ApiToken | None:
    """The token with this digest, with its user and the user's membership (or its absence) loaded, as
    ``select_related("user", "user__membership")`` would: in one plain statement, since every API request and
    websocket authenticates through here and compiling the three-table query cost more than running it."""
    sql, layout = _token_query()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [token_digest])
        row = cursor.fetchone()
    if row is None:
        return None
    loaded, start = [], 0
    for model, names, cols in layout:
        values = list(row[start : start + len(names)])
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


def scope_allows(token: ApiToken, method: str) -> bool:
    return token.scope == TokenScope.WRITE or method.upper() in SAFE_METHODS
