"""The API's content negotiation: DRF's, but a ``?format=`` that no renderer of the view writes is a 400 naming the
ones it does. DRF answers 404, which a client (and the schema) cannot tell from a missing object; a path's format
suffix that no renderer writes stays a 404 (no such path).

Its own module: DRF reads ``DEFAULT_CONTENT_NEGOTIATION_CLASS`` while defining ``APIView``, so the class must not
live in a module that imports DRF's views (controlplane/api.py does).
"""

from django.http import Http404
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation


class ContentNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except Http404:
            if format_suffix:  # a path with a suffix no renderer writes (``/audit/7.x/``) is no such path
                raise
            formats = sorted({renderer.format for renderer in renderers})
            raise exceptions.ValidationError({"format": [f"one of {', '.join(formats)}"]}) from None
