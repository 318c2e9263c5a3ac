"""Request context for the audit trail: where a write came from (page, API, CLI) and with which token."""

import contextvars
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RequestContext:
    source: str = "system"
    remote_addr: str | None = None
    token_prefix: str = ""


# The default is frozen, so sharing it is safe.
_current: contextvars.ContextVar[RequestContext] = contextvars.ContextVar(
    "lockstep_request",
    default=RequestContext(),  # noqa: B039
)


def current() -> RequestContext:
    return _current.get()


def set_context(context: RequestContext):
    return _current.set(context)


def reset(token) -> None:
    _current.reset(token)


def note_token(prefix: str) -> None:
    _current.set(replace(_current.get(), token_prefix=prefix))


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from controlplane.security_ratelimit import client_address

        source = "api" if request.path.startswith("/api/") else "page"
        token = set_context(RequestContext(source=source, remote_addr=client_address(request)))
        try:
            return self.get_response(request)
        finally:
            reset(token)
