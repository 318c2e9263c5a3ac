"""Blueprint sources: ``/blueprints/{id}/source/`` (provider roles) and the push webhook git hosts call."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.errors import ServiceError
from controlplane.openapi import ErrorSerializer
from fleet.api.serializers_sources import BlueprintSourceSerializer, BlueprintSourceWriteSerializer
from fleet.models import BlueprintSource
from fleet.services import sources as services


class BlueprintSourceActions:
    """The source actions of the blueprint viewset (mixed in; ``get_object`` scopes them to provider roles)."""

    def _source(self) -> BlueprintSource:
        source = BlueprintSource.objects.filter(blueprint=self.get_object()).first()
        if source is None:
            raise ServiceError("the blueprint has no source", status=404)
        return source

    @extend_schema(
        methods=["PUT"], request=BlueprintSourceWriteSerializer, responses={200: BlueprintSourceSerializer}
    )
    @extend_schema(methods=["GET"], request=None, responses=BlueprintSourceSerializer)
    @extend_schema(methods=["DELETE"], request=None, responses={204: None})
    @action(detail=True, methods=["get", "put", "delete"], url_path="source", url_name="source")
    def source(self, request, pk=None):
        """The git repository, branch or tag and path whose commits become the blueprint's versions. PUT sets or
        changes it (fields left out keep their value); DELETE stops taking versions from git."""
        if request.method == "GET":
            return Response(BlueprintSourceSerializer(self._source()).data)
        blueprint = self.get_object()
        if request.method == "DELETE":
            services.source_delete(actor=request.user, blueprint=blueprint)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = BlueprintSourceWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        source = services.source_set(actor=request.user, blueprint=blueprint, **data.validated_data)
        return Response(BlueprintSourceSerializer(source).data)

    @extend_schema(request=None, responses={202: dict})
    @action(detail=True, methods=["post"], url_path="source/sync", url_name="source-sync")
    def source_sync(self, request, pk=None):
        """Poll the source now (a worker fetches it; the source's commits show the outcome)."""
        services.source_poll_now(actor=request.user, blueprint=self.get_object())
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)


class BlueprintSourceWebhookView(APIView):
    """A git host's push webhook for one source. No token: the body is verified against the source's webhook
    secret (GitHub: ``X-Hub-Signature-256``, HMAC-SHA256; GitLab: ``X-Gitlab-Token``), compared in constant
    time; a push to the source's branch or tag queues a poll."""

    authentication_classes = []
    permission_classes = [AllowAny]
    parser_classes = []  # the body is read raw: the signature is over its bytes

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={200: dict, 401: ErrorSerializer, 403: ErrorSerializer},
        tags=["fleet"],
        auth=[],
    )
    def post(self, request, source_id: int):
        headers = {
            name: request.headers[name]
            for name in ("X-Hub-Signature-256", "X-Gitlab-Token", "X-GitHub-Event", "X-Gitlab-Event")
            if name in request.headers
        }
        return Response(services.source_webhook(source_id=source_id, headers=headers, body=request.body))
