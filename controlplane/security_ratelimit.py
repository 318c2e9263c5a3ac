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


def _client_address(request: HttpRequest) -> str:
    # uvicorn puts the client's address here, also behind a proxy it trusts (--forwarded-allow-ips).
    return request.META.get("REMOTE_ADDR") or "unknown"


def _login_name_and_address(group: str, request: HttpRequest) -> str:
    username = (request.POST.get("username") or "").strip().casefold()
    return f"{_client_address(request)}\n{username}"


def _login_address(group: str, request: HttpRequest) -> str:
    return _client_address(request)


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
