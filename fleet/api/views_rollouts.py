"""Rollouts (provider roles) and drift findings (scoped like clusters)."""

from collections import Counter

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.access import require
from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from fleet import selectors
from fleet.api.serializers import (
    DriftFindingSerializer,
    RolloutActionSerializer,
    RolloutCreateSerializer,
    RolloutDetailSerializer,
    RolloutSerializer,
)
from fleet.filtersets import DriftFindingFilterSet, RolloutFilterSet
from fleet.models import Rollout
from fleet.services import rollouts as services
from tenancy.permissions import IsProvider


def rollout_body(rollout, *, user) -> dict:
    rollout = selectors.rollout_detail(user=user, pk=rollout.pk)
    counts: dict[int, Counter] = {}
    for row in rollout.clusters.all():
        counts.setdefault(row.batch_index, Counter())[row.status] += 1
    return RolloutDetailSerializer(rollout, context={"counts": {k: dict(v) for k, v in counts.items()}}).data


class RolloutViewSet(mixins.ListModelMixin, ScopedViewSet):
    """Rollouts: start one, follow it per batch and cluster, pause, resume, cancel or roll it back."""

    serializer_class = RolloutSerializer
    filterset_class = RolloutFilterSet
    # Provider roles only (DESIGN), refused before any input is read: the selector alone guards reads, not writes.
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    http_method_names = ["get", "post", "head", "options"]

    def selector(self, *, user):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user to read for
            return Rollout.objects.none()
        return selectors.rollout_list(user=user)

    @extend_schema(responses=RolloutDetailSerializer)
    def retrieve(self, request, pk=None):
        return Response(rollout_body(self.get_object(), user=request.user))

    @extend_schema(request=RolloutCreateSerializer, responses={201: RolloutDetailSerializer})
    def create(self, request):
        data = RolloutCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        version = selectors.blueprint_version(
            user=request.user, blueprint_id=values["blueprint"], number=values["version"]
        )
        if version is None:
            raise ServiceError("no such version of that blueprint", field="version")
        rollout = services.rollout_start(
            actor=request.user, version=version, targets=values["targets"], strategy=values["strategy"]
        )
        return Response(rollout_body(rollout, user=request.user), status=status.HTTP_201_CREATED)

    def _act(self, request, service, with_reason=True):
        data = RolloutActionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        kwargs = {"reason": data.validated_data["reason"]} if with_reason else {}
        return Response(
            rollout_body(service(actor=request.user, rollout=self.get_object(), **kwargs), user=request.user)
        )

    @extend_schema(request=RolloutActionSerializer, responses=RolloutDetailSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        return self._act(request, services.rollout_pause)

    @extend_schema(request=None, responses=RolloutDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._act(request, services.rollout_resume, with_reason=False)

    @extend_schema(request=RolloutActionSerializer, responses=RolloutDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._act(request, services.rollout_cancel)

    @extend_schema(request=RolloutActionSerializer, responses=RolloutDetailSerializer)
    @action(detail=True, methods=["post"])
    def rollback(self, request, pk=None):
        return self._act(request, services.rollout_rollback)


class DriftFindingViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Drift findings, open and resolved, of the clusters the user sees in full; ``POST sweep/`` runs a sweep now."""

    serializer_class = DriftFindingSerializer
    filterset_class = DriftFindingFilterSet

    def selector(self, *, user):
        return selectors.drift_list(user=user)

    @extend_schema(
        request=None,
        parameters=[OpenApiParameter("cluster", OpenApiTypes.INT, required=False)],
        responses={200: dict},
    )
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def ignored(self, request):
        """The differences ignore rules silence (``ignore_differences`` of an add-on, or of the version's policy),
        per cluster and add-on, from the last observation; ``?cluster=`` for one cluster."""
        from fleet.selectors_ignored import ignored_differences

        raw = request.query_params.get("cluster")
        try:
            cluster = int(raw) if raw not in (None, "") else None
        except ValueError:
            raise ServiceError("a cluster id", field="cluster") from None
        if cluster is not None and not 0 < cluster < 2**31:
            raise ServiceError("a cluster id", field="cluster")
        return Response({"results": ignored_differences(user=request.user, cluster_id=cluster)})

    @extend_schema(request=None, responses={202: dict})
    @action(detail=False, methods=["post"])
    def sweep(self, request):
        """Queue a drift sweep of every cluster now (provider roles); findings appear as it finishes."""
        from fleet.services.drift import drift_sweep_request

        require(self.principal.may_operate, "drift sweeps are for provider roles")
        drift_sweep_request(actor=request.user)
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)
