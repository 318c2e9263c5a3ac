"""``/blueprints/{id}/overlays/``: per-cluster and per-label values over a blueprint's add-on values."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.errors import ServiceError
from fleet.models import ValuesOverlay
from fleet.services.overlays import overlays_set


def _shown(overlay: ValuesOverlay) -> dict:
    return {
        "name": overlay.name,
        "cluster": overlay.cluster_id,
        "labels": overlay.labels,
        "addon": overlay.addon,
        "values": overlay.values,
    }


class BlueprintOverlayActions:
    """The overlay action of the blueprint viewset (mixed in; ``get_object`` scopes it to provider roles)."""

    @extend_schema(
        methods=["PUT"],
        request={"application/json": OpenApiTypes.OBJECT},
        responses={200: OpenApiTypes.OBJECT},
    )
    @extend_schema(methods=["GET"], request=None, responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get", "put"], url_path="overlays", url_name="overlays")
    def overlays(self, request, pk=None):
        """The blueprint's values overlays, lowest precedence first (label overlays, then cluster overlays, each in
        list order, over the version's values). PUT ``{"overlays": [{"name", "cluster" | "labels", "addon",
        "values"}]}`` replaces them all."""
        blueprint = self.get_object()
        if request.method == "PUT":
            if not isinstance(request.data, dict) or "overlays" not in request.data:
                raise ServiceError('{"overlays": [...]}', field="overlays")
            overlays_set(actor=request.user, blueprint=blueprint, overlays=request.data["overlays"])
        rows = ValuesOverlay.objects.filter(blueprint=blueprint)
        return Response({"overlays": [_shown(row) for row in rows]})
