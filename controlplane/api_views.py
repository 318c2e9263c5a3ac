"""Endpoints of the shared machinery: the event log for catch-up and the audit trail."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers

from controlplane import events, selectors
from controlplane.access import require
from controlplane.api import EventSerializer, ScopedViewSet
from controlplane.filtersets import AuditEntryFilterSet
from controlplane.models import AuditEntry, Event


@extend_schema(
    parameters=[
        OpenApiParameter(
            "topic", OpenApiTypes.STR, description="a topic such as fleet, job-17; required for tenant users"
        ),
        OpenApiParameter(
            "after", OpenApiTypes.INT, description="only events with a sequence number above this"
        ),
    ]
)
class EventViewSet(mixins.ListModelMixin, ScopedViewSet):
    """The event log: after a reconnect, a page fetches ``?topic=job-17&after=<last seq seen>``."""

    serializer_class = EventSerializer
    queryset = Event.objects.none()  # the schema's model; requests read through the selector

    def selector(self, *, user):
        topic = self.request.query_params.get("topic") or None
        after = self.request.query_params.get("after")
        if topic is not None:
            try:
                events.parse_topic(topic)
            except events.UnknownTopic as error:
                raise exceptions.ValidationError({"topic": [str(error)]}) from error
            require(events.may_subscribe(user, topic), f"you may not read topic {topic!r}")
        elif not self.principal.is_provider:
            raise exceptions.ValidationError({"topic": ["this field is required"]})
        if after is not None:
            try:
                after = int(after)
                if not -1 <= after < 2**62:
                    raise ValueError
            except ValueError as error:
                raise exceptions.ValidationError({"after": ["a whole number is required"]}) from error
        return selectors.event_list(user=user, topic=topic, after=after)


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "created_at",
            "actor_name",
            "token_prefix",
            "source",
            "remote_addr",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "tenant_id",
            "changes",
        ]


class AuditEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """The audit trail: every write through a page or the API (provider roles)."""

    serializer_class = AuditEntrySerializer
    filterset_class = AuditEntryFilterSet
    queryset = AuditEntry.objects.none()  # the schema's model; requests read through the selector

    def selector(self, *, user):
        require(self.principal.may_read_audit, "the audit trail is for provider roles")
        return selectors.audit_list(user=user)
