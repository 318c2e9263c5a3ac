"""The site's error answers, with DEBUG on or off: a page in the site's layout (templates/400.html, 403.html,
404.html, 500.html) for a page, JSON ``{"detail": …}`` with the same status for anything under ``/api/``.

Django answers through the URLconf's handlers only with DEBUG off; with DEBUG on (``make run``) it shows its
debug pages instead (every URL pattern on a 404, the traceback on a 500). ``ErrorPageMiddleware`` answers those
through the same handlers, logging what Django would have logged (tracebacks stay in the log), unless the
``DEBUG_ERROR_PAGES`` setting asks for Django's debug pages. ``ApiErrorMiddleware`` makes every error under
``/api/`` JSON, whatever view or middleware answered it (a 405 of a plain view, a CSRF refusal)."""

import json
import logging

from django.conf import settings
from django.core import signals
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.handlers.exception import get_exception_response
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.urls import Resolver404, get_resolver, get_urlconf, is_valid_path
from django.utils.log import log_response
from django.views import defaults

API_PREFIX = "/api/"
DETAILS = {
    400: "Bad request.",
    403: "You do not have permission to perform this action.",
    404: "Not found.",
    500: "Server error.",
}


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def _detail(request: HttpRequest, status: int, exception=None) -> JsonResponse:
    message = str(exception) if status == 403 and exception is not None and str(exception) else ""
    return JsonResponse({"detail": message or DETAILS.get(status, "Error.")}, status=status)


def bad_request(request, exception=None):
    if is_api(request):
        return _detail(request, 400)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    """The refusal's own words (``controlplane.access.require``) on the page or in the JSON."""
    if is_api(request):
        return _detail(request, 403, exception)
    return defaults.permission_denied(request, exception)


def page_not_found(request, exception=None):
    if is_api(request):
        return _detail(request, 404)
    return defaults.page_not_found(request, exception)


def server_error(request):
    """Rendered with no request context: nothing on the page needs the database, which may be why it failed."""
    if is_api(request):
        return _detail(request, 500)
    return defaults.server_error(request)


def csrf_failure(request, reason=""):
    """A form posted with a missing or stale CSRF token (the session ended, the page was open too long)."""
    return permission_denied(
        request,
        PermissionDenied(
            "CSRF verification failed: the form's security token is missing or out of date. "
            "Reload the page and send it again."
        ),
    )


def replaces_debug_pages() -> bool:
    """Whether the site's own error answers stand in for Django's debug pages (DEBUG on, DEBUG_ERROR_PAGES off)."""
    return settings.DEBUG and not getattr(settings, "DEBUG_ERROR_PAGES", False)


class ApiErrorMiddleware:
    """Any error answer under ``/api/`` that is not JSON (a 405 of a plain view, Django's CSRF or bad-host
    refusal, a debug page) gets the body ``{"detail": …}`` instead; its status, headers and cookies stay.

    Placed near the top, so it sees the answers of the middleware below it as well as the views'."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            is_api(request)
            and response.status_code >= 400
            and not response.streaming
            and not _is_json(response, request)
        ):
            _make_json(request, response)
        return response


class ErrorPageMiddleware:
    """With DEBUG on (and DEBUG_ERROR_PAGES off), answers what Django would answer with a debug page through the
    URLconf's handlers instead, logging what Django logs with DEBUG off (the traceback of a 500).

    Placed after the session, authentication and message middleware (the error pages show the reader's
    navigation) and before ``DatabaseErrorMiddleware``, whose 400 and 503 answers come first."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        urlconf = getattr(request, "urlconf", None)
        if replaces_debug_pages() and not is_valid_path(request.path_info, urlconf):
            # No pattern matches: Django's DEBUG answer would list them all. CommonMiddleware still redirects to
            # the path with a slash where that one matches.
            return get_exception_response(
                request, get_resolver(urlconf), 404, Resolver404({"path": request.path_info})
            )
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not replaces_debug_pages():
            return None  # Django's own handling: the URLconf's handlers with DEBUG off
        resolver = get_resolver(get_urlconf())
        if isinstance(exception, Http404):
            return get_exception_response(request, resolver, 404, exception)
        if isinstance(exception, PermissionDenied | MultiPartParserError):
            return None  # Django answers these through the handlers whatever DEBUG is
        if isinstance(exception, BadRequest | SuspiciousOperation):
            return _bad_request(request, resolver, exception)
        if settings.DEBUG_PROPAGATE_EXCEPTIONS:
            return None
        # As Django does with DEBUG off: the signal, the 500 handler, the traceback in the log.
        signals.got_request_exception.send(sender=None, request=request)
        response = resolver.resolve_error_handler(500)(request)
        log_response(
            "%s: %s",
            response.reason_phrase,
            request.path,
            response=response,
            request=request,
            exception=exception,
        )
        return response


def _bad_request(request, resolver, exception) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig | TooManyFieldsSent | TooManyFilesSent):
        request._mark_post_parse_error()  # the body cannot be read again
    response = get_exception_response(request, resolver, 400, exception)
    if isinstance(exception, SuspiciousOperation):
        logger = logging.getLogger(f"django.security.{exception.__class__.__name__}")
        log_response(
            str(exception),
            exception=exception,
            request=request,
            response=response,
            level="error",
            logger=logger,
        )
    else:
        log_response("%s: %s", str(exception), request.path, response=response, request=request)
    return response


def _is_json(response: HttpResponse, request: HttpRequest | None = None) -> bool:
    """JSON; or a DRF answer in the format its client named (``?format=yaml``: YAML's ``detail:``)."""
    kind = response.get("Content-Type", "").split(";")[0].strip()
    if kind == "application/json" or kind.endswith("+json"):
        return True
    asked = request is not None and bool(request.GET.get("format"))
    return (
        asked
        and getattr(response, "accepted_renderer", None) is not None
        and isinstance(getattr(response, "data", None), dict)
    )


def _make_json(request: HttpRequest, response: HttpResponse) -> None:
    status = response.status_code
    if status == 405:
        detail = f'Method "{request.method}" not allowed.'
    else:
        detail = DETAILS.get(status) or f"{response.reason_phrase}."
    response.content = json.dumps({"detail": detail}).encode()
    response["Content-Type"] = "application/json"
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(response.content))
