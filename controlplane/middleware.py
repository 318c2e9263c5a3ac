"""Database errors a request can meet, answered plainly instead of as a server error.

- Input the database refuses (a number or a time zone offset out of its range) is the client's mistake: 400.
- The database unreachable, or a transaction it aborted (a deadlock, a failover, a connection cut) is transient:
  503 with Retry-After. Nothing was written (the transaction rolled back), so the client can retry; with an
  ``Idempotency-Key`` a retried fault report is still one fault.
"""

import logging

from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse

log = logging.getLogger(__name__)
RETRY_AFTER_SECONDS = 5


class DatabaseErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        api = request.path.startswith(
            ("/api/", "/metrics")
        )  # the JSON answers: the API and the scrape endpoint
        if isinstance(exception, DataError):
            log.info("data error answered as 400 on %s: %s", request.path, exception)
            message = "a value in the request is out of the range the database accepts"
            return JsonResponse({"detail": message}, status=400) if api else HttpResponseBadRequest(message)
        if isinstance(exception, OperationalError | InterfaceError):
            log.warning("database unavailable, answered 503 on %s: %s", request.path, exception)
            message = "the database is unavailable for a moment; nothing was changed, try again"
            response = (
                JsonResponse({"detail": message}, status=503)
                if api
                else HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
            )
            response["Retry-After"] = str(RETRY_AFTER_SECONDS)
            return response
        return None
