"""The REST shape every kind of token bound to one cluster shares (agent tokens, launcher credentials).

Provider roles list them, issue one for a cluster they see (``POST``; the token is in that answer only, its
digest is what is stored) and revoke one (``DELETE``). Each kind names its serializers and the services that
issue and revoke it; the token machinery itself is tenancy's (``tenancy.services.token_issue``).
"""

from rest_framework import mixins, status
from rest_framework.response import Response

from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from controlplane.security_ratelimit import TokenCreateThrottle
from fleet.selectors import cluster_list
from tenancy.permissions import IsProvider


class ClusterTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    permission_classes = [*ScopedViewSet.permission_classes, IsProvider]
    throttle_classes = [TokenCreateThrottle]  # issuing is limited to TOKEN_CREATE_RATE per user
    filterset_fields = ["cluster"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def issue(self, *, actor, cluster, name: str):  # pragma: no cover - each kind supplies its own
        raise NotImplementedError

    def revoke(self, *, actor, token):  # pragma: no cover - each kind supplies its own
        raise NotImplementedError

    def issued(self, token, raw: str) -> Response:
        """The answer to an issue: the token as it is listed, and the token itself, shown this once."""
        body = self.serializer_class(token).data
        body["token"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    def create(self, request):
        data = self.serializer_class(data=request.data)
        data.is_valid(raise_exception=True)
        cluster = cluster_list(user=request.user).filter(pk=data.validated_data["cluster_id"]).first()
        if cluster is None:
            raise ServiceError("no such cluster", field="cluster")
        return self.issued(*self.issue(actor=request.user, cluster=cluster, name=data.validated_data["name"]))

    def destroy(self, request, pk=None):
        self.revoke(actor=request.user, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
