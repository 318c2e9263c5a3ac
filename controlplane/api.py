"""What every app's API shares: the error handler, the base viewset, the event serializer, and serializers built
once per process for the hot paths. The JSON 404 and 500 of routes no view answers: controlplane/error_pages.py."""

import functools
import logging

from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.http import Http404
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.access import Refused, principal
from controlplane.errors import ServiceError

log = logging.getLogger(__name__)


def exception_handler(exc, context):
    """DRF's handler, plus the errors services and the ORM raise: always JSON, always 4xx for bad input."""
    if isinstance(exc, Refused) and not exc.detail:
        exc = exceptions.PermissionDenied()  # a refusal without words: DRF's own
    elif isinstance(exc, ServiceError):
        return Response(exc.as_response_data(), status=exc.status)
    if isinstance(exc, DjangoValidationError):
        data = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        return Response(data, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ObjectDoesNotExist):
        exc = Http404()
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, IntegrityError):
        log.info("integrity error answered as 409: %s", exc)
        return Response({"detail": "conflicts with existing data"}, status=status.HTTP_409_CONFLICT)
    # A DataError (input the database refuses) is left to controlplane.middleware.DatabaseErrorMiddleware, which
    # answers 400 for pages and the API alike.
    response = drf_exception_handler(exc, context)
    if isinstance(exc, exceptions.ValidationError) and isinstance(response.data, list):
        # A body that is no object at all (``null``, a list) fails as a whole: the errors are still an object.
        response.data = {api_settings.NON_FIELD_ERRORS_KEY: response.data}
    return response


class ScopedViewSet(viewsets.GenericViewSet):
    """Base viewset: the queryset always comes from a selector that takes the user it reads for."""

    # Every object is addressed by its integer id: anything else in the URL is 404 at routing, before a view
    # could hand a non-number to a query (a 500).
    lookup_value_regex = r"[0-9]+"

    def selector(self, *, user):  # pragma: no cover - each viewset supplies its own
        raise NotImplementedError

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False) and self.queryset is not None:
            return self.queryset  # building the schema: no user to read for
        return self.selector(user=self.request.user)

    @property
    def principal(self):
        return principal(self.request.user)


@functools.cache
def _built(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    serializer = serializer_class()
    serializer.fields  # noqa: B018 - built here, once, not on first use by two threads at a time
    return serializer


def validated(serializer_class: type[serializers.Serializer], data) -> dict:
    """``data`` validated by ``serializer_class``, as ``is_valid(raise_exception=True)`` would (the same
    ValidationError, the same 400), without building its fields again: DRF deep-copies a serializer's declared fields
    (and a ModelSerializer derives its own from the model) on every instance, a tenth of a fault report's CPU. One
    instance per class and process is built instead, and only its stateless ``run_validation`` is called, so threads
    share it safely. For serializers whose fields need no request context."""
    return dict(_built(serializer_class).run_validation(data))


def represented(serializer_class: type[serializers.Serializer], instance) -> dict:
    """``serializer_class(instance).data``, by the same one instance per class and process as ``validated``."""
    return _built(serializer_class).to_representation(instance)


class EventSerializer(serializers.Serializer):
    topic = serializers.CharField()
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    payload = serializers.JSONField()
    url = serializers.CharField()
    created = serializers.DateTimeField(source="created_at")
