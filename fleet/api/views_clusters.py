"""Fleets, clusters and nodes."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from controlplane.openapi import ErrorSerializer
from fleet import selectors
from fleet.api.serializers import (
    AssignmentSerializer,
    ClusterOrOutlineSerializer,
    ClusterSerializer,
    FleetSerializer,
    NodeActionSerializer,
    NodeSerializer,
    NodeWriteSerializer,
)
from fleet.drivers import driver_for
from fleet.drivers.base import Operation
from fleet.filtersets import ClusterFilterSet, FleetFilterSet, NodeFilterSet
from fleet.services import clusters as services
from fleet.services.node_taints import node_set_taints
from fleet.services.nodes import node_cordon, node_drain, node_uncordon
from fleet.status import cluster_status, fleet_status
from tenancy.permissions import ProviderWrites


class FleetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Fleets: provider roles see and change all; a tenant user sees the fleets holding its dedicated clusters."""

    serializer_class = FleetSerializer
    filterset_class = FleetFilterSet
    permission_classes = [*ScopedViewSet.permission_classes, ProviderWrites]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def selector(self, *, user):
        return selectors.fleet_list(user=user)

    def retrieve(self, request, pk=None):
        fleet = self.get_object()
        body = FleetSerializer(fleet).data
        if self.principal.is_provider:
            rollup = fleet_status(fleet.pk)
            body["status"] = {
                "sync": rollup.sync,
                "health": rollup.health,
                "ready": rollup.ready,
                "total": rollup.total,
            }
        return Response(body)

    def create(self, request):
        data = FleetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fleet = services.fleet_create(actor=request.user, **data.validated_data)
        return Response(FleetSerializer(fleet).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        data = FleetSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        fleet = services.fleet_update(actor=request.user, fleet=self.get_object(), **data.validated_data)
        return Response(FleetSerializer(fleet).data)

    def destroy(self, request, pk=None):
        services.fleet_delete(actor=request.user, fleet=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class ClusterViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Clusters with their status roll-up. Tenant users see their dedicated clusters in full and, of shared
    clusters, only name, tier and blueprint version. Credentials are write-only (provider admin)."""

    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet
    permission_classes = [*ScopedViewSet.permission_classes, ProviderWrites]
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options"]

    def selector(self, *, user):
        return selectors.cluster_catalog(user=user)

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["sees_in_full"] = lambda cluster: selectors.sees_in_full(self.request.user, cluster)
        return context

    @extend_schema(responses=ClusterOrOutlineSerializer)
    def list(self, request):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        context = self.get_serializer_context()
        context["statuses"] = cluster_status([c.pk for c in page])
        return self.get_paginated_response(ClusterSerializer(page, many=True, context=context).data)

    @extend_schema(responses=ClusterOrOutlineSerializer)
    def retrieve(self, request, pk=None):
        cluster = self.get_object()
        context = self.get_serializer_context()
        context["statuses"] = cluster_status([cluster.pk])
        return Response(ClusterSerializer(cluster, context=context).data)

    def _full(self, pk):
        """The cluster for a change: only ones the user sees in full (a shared cluster is 404 to tenants)."""
        return selectors.cluster_list(user=self.request.user).get(pk=pk)

    def create(self, request):
        data = ClusterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cluster = services.cluster_create(actor=request.user, **data.validated_data)
        return Response(ClusterSerializer(cluster).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, pk=None):
        data = ClusterSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        cluster = services.cluster_update(actor=request.user, cluster=self._full(pk), **data.validated_data)
        return Response(ClusterSerializer(cluster).data)

    def destroy(self, request, pk=None):
        services.cluster_delete(actor=request.user, cluster=self._full(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: dict, 503: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def reconcile(self, request, pk=None):
        """Observe the cluster now and re-apply whatever of its blueprint version has drifted."""
        return Response(services.cluster_reconcile(actor=request.user, cluster=self._full(pk)))

    @extend_schema(request=AssignmentSerializer, responses=ClusterSerializer)
    @action(detail=True, methods=["put"], url_path="blueprint")
    def blueprint(self, request, pk=None):
        """Pin a version (``{"blueprint": id, "version": n}``) or track the latest (``"track_latest": true``)."""
        data = AssignmentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        blueprint = selectors.blueprint_list(user=request.user).filter(pk=values.pop("blueprint")).first()
        if blueprint is None:
            raise ServiceError("no such blueprint", field="blueprint")
        cluster = services.cluster_assign(
            actor=request.user, cluster=self._full(pk), blueprint=blueprint, **values
        )
        return Response(ClusterSerializer(cluster, context={"statuses": cluster_status([cluster.pk])}).data)


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Nodes with GPUs and NICs; cordon, drain and uncordon within the fleet's caps (provider roles)."""

    serializer_class = NodeSerializer
    filterset_class = NodeFilterSet
    permission_classes = [*ScopedViewSet.permission_classes, ProviderWrites]
    http_method_names = ["get", "patch", "post", "head", "options"]

    def selector(self, *, user):
        return selectors.node_list(user=user).prefetch_related("gpus", "nics")

    @extend_schema(request=NodeWriteSerializer, responses={200: NodeSerializer, 503: ErrorSerializer})
    def partial_update(self, request, pk=None):
        data = NodeWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = node_set_taints(
            actor=request.user, node=self.get_object(), taints=data.validated_data["taints"]
        )
        return Response(NodeSerializer(node).data)

    def _act(self, request, operation: Operation, service):
        node = self.get_object()
        data = NodeActionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if operation not in driver_for(node.cluster).supports:
            raise ServiceError(f"the {node.cluster.driver} driver cannot {operation.value}", status=409)
        node = service(actor=request.user, node=node, reason=data.validated_data["reason"])
        return Response(NodeSerializer(node).data)

    @extend_schema(request=NodeActionSerializer, responses={200: NodeSerializer, 503: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        return self._act(request, Operation.CORDON, node_cordon)

    @extend_schema(request=NodeActionSerializer, responses={200: NodeSerializer, 503: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        return self._act(request, Operation.DRAIN, node_drain)

    @extend_schema(request=NodeActionSerializer, responses={200: NodeSerializer, 503: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        return self._act(request, Operation.UNCORDON, node_uncordon)
