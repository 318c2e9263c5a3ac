from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions, mixins, permissions, renderers, serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api import ScopedViewSet
from fleet.api.views_tokens import ClusterTokenViewSet
from telemetry import selectors
from telemetry.api.serializers import (
    AgentTokenCreatedSerializer,
    AgentTokenSerializer,
    NotificationChannelSerializer,
    NotificationDeliverySerializer,
    PredictionSerializer,
)
from telemetry.authentication import AgentPrincipal, AgentTokenAuthentication
from telemetry.services.ingest import telemetry_ingest
from telemetry.services.tokens import agent_token_create, agent_token_revoke, agent_token_rotate
from tenancy.permissions import IsProvider, ProviderReadAdminWrite


class IsAgent(permissions.BasePermission):
    message = "This endpoint takes an agent token (lsa_…), bound to one cluster."

    def has_permission(self, request, view):
        return isinstance(request.user, AgentPrincipal)


class RawBodyParser:
    """Leave the body as bytes: the whole batch is validated at once against the compiled schema."""

    media_type = "application/json"

    def parse(self, stream, media_type=None, parser_context=None):  # pragma: no cover - never asked to parse
        return stream.read()


IngestResultSerializer = inline_serializer(
    "IngestResult",
    {
        "batch_id": serializers.UUIDField(),
        "duplicate": serializers.BooleanField(),
        "readings": serializers.IntegerField(),
        "nics": serializers.IntegerField(),
        "events": serializers.IntegerField(),
        "facility": serializers.IntegerField(),
        "faults": serializers.ListField(child=serializers.IntegerField()),
    },
)


class TelemetryIngestView(APIView):
    """Batched node telemetry and facility series from agents (docs/ingest-schema.md).

    An agent token may report only for its own cluster's nodes and racks. A rejected batch stores nothing;
    a batch whose id was seen before changes nothing and answers ``"duplicate": true``.
    """

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    parser_classes = [RawBodyParser]

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={200: IngestResultSerializer},
        examples=[
            OpenApiExample("schema", value={"see": "agent/lockstep_agent/schema/telemetry-batch.schema.json"})
        ],
    )
    def post(self, request):
        if request.content_type.split(";")[0].strip() != "application/json":
            raise exceptions.UnsupportedMediaType(request.content_type)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.TELEMETRY_MAX_BATCH_BYTES
        if length > limit:
            return Response(
                {"detail": f"batch of {length} bytes is over the {limit}-byte limit"},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        body = request.stream.read(limit + 1) if request.stream is not None else b""
        if len(body) > limit:
            return Response(
                {"detail": f"batch is over the {limit}-byte limit"},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        result = telemetry_ingest(cluster=request.auth.cluster, body=body)
        return Response(result.as_dict())


TOO_MANY_TOKENS = OpenApiResponse(
    description="Too many tokens issued: wait the Retry-After header's seconds."
)


@extend_schema_view(
    create=extend_schema(
        request=AgentTokenSerializer, responses={201: AgentTokenCreatedSerializer, 429: TOO_MANY_TOKENS}
    ),
)
class AgentTokenViewSet(ClusterTokenViewSet):
    """Agent tokens, each bound to one cluster (provider roles). DELETE revokes; ``rotate/`` revokes and reissues."""

    serializer_class = AgentTokenSerializer

    def selector(self, *, user):
        return selectors.agent_token_list(user=user)

    def issue(self, *, actor, cluster, name):
        return agent_token_create(actor=actor, cluster=cluster, name=name)

    def revoke(self, *, actor, token):
        agent_token_revoke(actor=actor, token=token)

    @extend_schema(request=None, responses={201: AgentTokenCreatedSerializer, 429: TOO_MANY_TOKENS})
    @action(detail=True, methods=["post"])
    def rotate(self, request, pk=None):
        return self.issued(*agent_token_rotate(actor=request.user, token=self.get_object()))


class AlertmanagerWebhookView(APIView):
    """Prometheus Alertmanager webhook (payload version 4). Authenticate with a provider user's write token
    (``http_config.authorization.credentials`` in the receiver). Each alert's outcome is returned."""

    permission_classes = [*APIView.permission_classes, IsProvider]

    @extend_schema(request={"application/json": OpenApiTypes.OBJECT}, responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        from telemetry.services.alerts import alertmanager_ingest

        return Response(alertmanager_ingest(actor=request.user, payload=request.data))


class PrometheusRenderer(renderers.BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes) else str(data).encode()


class MetricsView(APIView):
    """Prometheus exposition (provider roles: scrape with a read token in ``authorization.credentials``)."""

    permission_classes = [*APIView.permission_classes, IsProvider]
    renderer_classes = [PrometheusRenderer, renderers.JSONRenderer]

    def handle_exception(self, exc):
        # A refusal is JSON like everywhere else in the API, not the exposition format the scraper asked for.
        response = super().handle_exception(exc)
        self.request.accepted_renderer = renderers.JSONRenderer()
        self.request.accepted_media_type = "application/json"
        return response

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request):
        from prometheus_client import CONTENT_TYPE_LATEST

        from telemetry.metrics import exposition

        return Response(exposition(), content_type=CONTENT_TYPE_LATEST)


class NotificationChannelViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    ScopedViewSet,
):
    """Webhooks for what a human must see: failed recoveries, nodes that need support, rollouts that stopped
    or rolled back, automation paused. Provider roles read; the provider admin changes."""

    serializer_class = NotificationChannelSerializer
    permission_classes = [*ScopedViewSet.permission_classes, ProviderReadAdminWrite]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def selector(self, *, user):
        return selectors.notification_channel_list(user=user)

    def perform_create(self, serializer):
        from telemetry.services.channels import channel_create

        serializer.instance = channel_create(actor=self.request.user, **serializer.validated_data)

    def perform_update(self, serializer):
        from telemetry.services.channels import channel_update

        serializer.instance = channel_update(
            actor=self.request.user, channel=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        from telemetry.services.channels import channel_delete

        channel_delete(actor=self.request.user, channel=instance)


class NotificationDeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """The delivery log (provider roles)."""

    serializer_class = NotificationDeliverySerializer
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    filterset_fields = ["state", "rule", "channel"]

    def selector(self, *, user):
        return selectors.notification_delivery_list(user=user)


class PredictionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Failure predictions: node, score, horizon, cause, what was done and the outcome (provider roles)."""

    serializer_class = PredictionSerializer
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    filterset_fields = ["cluster", "node", "outcome", "cause_kind"]

    def selector(self, *, user):
        return selectors.prediction_list(user=user)


class JobDiagnosisView(APIView):
    """Is it the fabric? Why this job runs slow: the fabric ruled in (the likeliest link, switch or rail, with
    the evidence) or out (the GPUs or hosts that stand out instead). Visible to whoever may see the job."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request, pk: int):
        from jobs.selectors import job_list
        from telemetry.diagnosis import diagnose

        job = job_list(user=request.user).filter(pk=pk).first()
        if job is None:
            raise exceptions.NotFound()
        return Response(diagnose(job))
