"""Blueprints, their versions, the YAML document and diffs between versions (provider roles only)."""

from django.db.models import Count
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from controlplane.parsers import JSONParser
from fleet import blueprint_yaml, selectors
from fleet.api.serializers import (
    BlueprintSerializer,
    BlueprintWriteSerializer,
    VersionSerializer,
    VersionWriteSerializer,
)
from fleet.api.views_overlays import BlueprintOverlayActions
from fleet.api.views_sources import BlueprintSourceActions
from fleet.api.yaml import YAMLTextParser, YAMLTextRenderer
from fleet.diffing import version_diff
from fleet.filtersets import BlueprintFilterSet
from fleet.models import Blueprint, BlueprintVersion
from fleet.services import blueprints as services
from fleet.services.blueprint_documents import blueprint_apply
from tenancy.permissions import IsProvider

NUMBER = r"(?P<number>[0-9]{1,9})"


class BlueprintViewSet(
    BlueprintSourceActions,
    BlueprintOverlayActions,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    ScopedViewSet,
):
    """Blueprints: named bundles of add-ons published as immutable numbered versions."""

    serializer_class = BlueprintSerializer
    filterset_class = BlueprintFilterSet
    # Provider roles only (DESIGN), refused before any input is read: the selector alone guards reads, not writes.
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def selector(self, *, user):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user to read for
            return Blueprint.objects.none()
        return selectors.blueprint_list(user=user).prefetch_related("versions")

    @extend_schema(request=BlueprintWriteSerializer, responses={201: BlueprintSerializer})
    def create(self, request):
        data = BlueprintWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        blueprint = services.blueprint_create(actor=request.user, **data.validated_data)
        return Response(BlueprintSerializer(blueprint).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=BlueprintWriteSerializer, responses=BlueprintSerializer)
    def partial_update(self, request, pk=None):
        data = BlueprintWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        values = {k: v for k, v in data.validated_data.items() if k != "name"}
        blueprint = services.blueprint_update(actor=request.user, blueprint=self.get_object(), **values)
        return Response(BlueprintSerializer(blueprint).data)

    def _version(self, number) -> BlueprintVersion:
        return self.get_object().versions.select_related("parent", "commit").get(number=number)

    @extend_schema(methods=["GET"], request=None, responses=VersionSerializer(many=True))
    @extend_schema(methods=["POST"], request=VersionWriteSerializer, responses={201: VersionSerializer})
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def versions(self, request, pk=None):
        """GET: every version with how many clusters carry it; POST: a new draft (``"activate": true`` too)."""
        blueprint = self.get_object()
        if request.method == "GET":
            rows = blueprint.versions.select_related("parent", "commit").annotate(
                cluster_count=Count("clusters")
            )
            return Response(VersionSerializer(rows, many=True).data)
        data = VersionWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.version_create(actor=request.user, blueprint=blueprint, **data.validated_data)
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=VersionWriteSerializer, responses=VersionSerializer)
    @action(detail=True, methods=["get", "patch"], url_path=f"versions/{NUMBER}")
    def version(self, request, pk=None, number=None):
        """One version; PATCH changes a draft (an active version answers 400 naming the field)."""
        version = self._version(number)
        if request.method == "PATCH":
            data = VersionWriteSerializer(data=request.data, partial=True)
            data.is_valid(raise_exception=True)
            values = {k: v for k, v in data.validated_data.items() if k not in ("activate", "parent")}
            if "parent" in request.data:
                raise ServiceError("the parent is chosen when the version is created", field="parent")
            version = services.version_update(actor=request.user, version=version, **values)
        return Response(VersionSerializer(version).data)

    @extend_schema(request=None, responses=VersionSerializer)
    @action(detail=True, methods=["post"], url_path=f"versions/{NUMBER}/activate")
    def activate(self, request, pk=None, number=None):
        """Make the draft immutable; tracking clusters follow through a rollout with the default strategy."""
        version = services.version_activate(actor=request.user, version=self._version(number))
        return Response(VersionSerializer(version).data)

    @extend_schema(request=None, responses=VersionSerializer)
    @action(detail=True, methods=["post"], url_path=f"versions/{NUMBER}/disable")
    def disable(self, request, pk=None, number=None):
        version = services.version_disable(actor=request.user, version=self._version(number))
        return Response(VersionSerializer(version).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("from", OpenApiTypes.INT, required=True),
            OpenApiParameter("to", OpenApiTypes.INT, required=True),
        ],
        responses={200: dict},
    )
    @action(detail=True, methods=["get"])
    def diff(self, request, pk=None):
        """What changed between two versions: add-ons added, removed and changed; node software; policy."""
        blueprint = self.get_object()
        numbers = {}
        for key in ("from", "to"):
            try:
                numbers[key] = int(request.query_params.get(key, ""))
            except ValueError as error:
                raise ServiceError("a version number", field=key) from error
        found = {v.number: v for v in blueprint.versions.filter(number__in=numbers.values())}
        for key, number in numbers.items():
            if number not in found:
                raise ServiceError(f"blueprint {blueprint.name} has no version {number}", field=key)
        return Response(version_diff(found[numbers["from"]], found[numbers["to"]]))

    # The document is one YAML mapping (docs/fleet.md, YAML), so its schema is an object in either direction.
    @extend_schema(
        request={"application/yaml": OpenApiTypes.OBJECT},
        responses={(200, "application/yaml"): OpenApiTypes.OBJECT},
    )
    @action(
        detail=True,
        methods=["get", "put"],
        parser_classes=[YAMLTextParser, JSONParser],
        renderer_classes=[JSONRenderer, YAMLTextRenderer],
    )
    def yaml(self, request, pk=None):
        """The whole blueprint as one YAML document; PUT applies a document of the same shape (all or nothing)."""
        blueprint = self.get_object()
        if request.method == "PUT":
            if request.content_type.split(";")[0].strip() != "application/yaml":
                raise ServiceError("send the document as application/yaml", field="document", status=415)
            document = blueprint_yaml.load(request.body)
            blueprint, _ = blueprint_apply(actor=request.user, document=document, expect_name=blueprint.name)
        return HttpResponse(blueprint_yaml.dump(blueprint), content_type="application/yaml; charset=utf-8")
