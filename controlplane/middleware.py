"""Input the database refuses (a number or a time zone offset out of its range) is the client's mistake: 400."""

import logging

from django.db import DataError
from django.http import HttpResponseBadRequest, JsonResponse

log = logging.getLogger(__name__)


class DataErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, DataError):
            return None
        log.info("data error answered as 400 on %s: %s", request.path, exception)
        message = "a value in the request is out of the range the database accepts"
        if request.path.startswith("/api/"):
            return JsonResponse({"detail": message}, status=400)
        return HttpResponseBadRequest(message)
