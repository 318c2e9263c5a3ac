"""Rate limits on the endpoints that take or hand out credentials: the login form and token issue.

Counted with django-ratelimit in the Redis cache: one atomic increment per attempt in a fixed window per key, so
parallel attempts cannot slip past the count (DRF's throttles read, append and write back a history, and say
themselves they are no guard against brute force). A refused request is answered 429 with Retry-After, the
seconds left in its window. Should Redis be unreachable the limits step aside (logged) rather than lock
everybody out; Lockstep's readiness check reports Redis down. See docs/security.md.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from django_ratelimit.core import get_usage
from redis.exceptions import RedisError
from rest_framework.throttling import BaseThrottle

log = logging.getLogger(__name__)


# The key that requests share whose address Lockstep cannot vouch for (see client_address).
UNVERIFIED = "unverified"


def client_address(request: HttpRequest) -> str | None:
    """The client's address as far as Lockstep can vouch for it (None where it cannot): what rate limits key on and
    the audit trail records.

    uvicorn replaces the peer's address with one from ``X-Forwarded-For`` when the peer is a proxy it trusts: the
    ones in ``FORWARDED_ALLOW_IPS`` (the Procfile passes them; uvicorn also reads the variable), but 127.0.0.1 when
    it is started by hand with the variable unset. So with no proxy configured here, an address that is one of the
    header's is the header's word, and anyone on the host could pick it (issue 54). An address not in the header is
    the peer's own; with proxies configured, uvicorn chose it as they say. See docs/security.md, "Behind a proxy"."""
    remote = request.META.get("REMOTE_ADDR") or None
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if not header or settings.FORWARDED_ALLOW_IPS:
        return remote
    return None if remote in _hosts(header) else remote


def _hosts(header: str) -> set[str]:
    """The hosts an X-Forwarded-For header names, with and without a port (``1.2.3.4:80``, ``[::1]:80``)."""
    hosts = set()
    for entry in (part.strip() for part in header.split(",")):
        hosts.add(entry)
        if entry.startswith("["):
            hosts.add(entry[1:].split("]", 1)[0])
        elif entry.count(":") == 1:
            hosts.add(entry.split(":", 1)[0])
    return hosts


def _address_key(request: HttpRequest) -> str:
    """Requests whose address cannot be vouched for share one count, so a forged header buys no fresh ones."""
    return client_address(request) or UNVERIFIED


def _login_name_and_address(group: str, request: HttpRequest) -> str:
    username = (request.POST.get("username") or "").strip().casefold()
    return f"{_address_key(request)}\n{username}"


def _login_address(group: str, request: HttpRequest) -> str:
    return _address_key(request)


def _user(group: str, request: HttpRequest) -> str:
    return str(request.user.pk)


@dataclass(frozen=True)
class Limit:
    group: str
    rate_setting: str  # the setting that holds the rate, e.g. "5/min"
    key: Callable[[str, HttpRequest], str]


# Per user name and address, so nobody locks another user out from elsewhere; per address, so one client cannot
# try many user names.
LOGIN = (
    Limit("login", "LOGIN_RATE", _login_name_and_address),
    Limit("login-address", "LOGIN_ADDRESS_RATE", _login_address),
)
TOKEN_CREATE = (Limit("token-create", "TOKEN_CREATE_RATE", _user),)


def refused(request: HttpRequest, limits: tuple[Limit, ...]) -> int | None:
    """Count this request against each limit. Returns the seconds to wait when any limit is exceeded, else None."""
    waits = []
    for limit in limits:
        try:
            usage = get_usage(
                request,
                group=limit.group,
                key=limit.key,
                rate=getattr(settings, limit.rate_setting),
                increment=True,
            )
        except RedisError as error:
            log.warning("rate limit %s not counted, Redis unreachable: %r", limit.group, error)
            continue
        if usage and usage["should_limit"]:
            waits.append(max(1, usage["time_left"]))
    return max(waits) if waits else None


def retry_after(response, wait: int):
    """Mark a 429 response with the seconds to wait."""
    response["Retry-After"] = str(wait)
    return response


class TokenCreateThrottle(BaseThrottle):
    """For API views that issue tokens: every POST counts against TOKEN_CREATE_RATE for its user; past it DRF
    answers 429 with Retry-After."""

    def allow_request(self, request, view) -> bool:
        self.wait_seconds = None
        if request.method != "POST" or not request.user.is_authenticated:
            return True
        self.wait_seconds = refused(request, TOKEN_CREATE)
        return self.wait_seconds is None

    def wait(self):
        return self.wait_seconds
