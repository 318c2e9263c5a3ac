from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.access import PROVIDER_ROLES, principal, require
from controlplane.api import ScopedViewSet
from controlplane.errors import ServiceError
from controlplane.security_ratelimit import TokenCreateThrottle
from tenancy import selectors, services
from tenancy.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    TenantSerializer,
    TenantWriteSerializer,
    UserCreatedSerializer,
    UserCreateSerializer,
    UserPasswordSerializer,
    UserRoleSerializer,
    UserSerializer,
)
from tenancy.permissions import ProviderReadAdminWrite


class TenantViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Tenants (provider roles read; the provider admin creates and changes)."""

    serializer_class = TenantSerializer
    permission_classes = [*ScopedViewSet.permission_classes, ProviderReadAdminWrite]
    filterset_fields = ["tier", "slug"]
    http_method_names = ["get", "post", "patch", "head", "options"]

    def selector(self, *, user):
        return selectors.tenant_list(user=user)

    @extend_schema(request=TenantWriteSerializer, responses={201: TenantSerializer})
    def create(self, request):
        data = TenantWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        tenant = services.tenant_create(actor=request.user, **data.validated_data)
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=TenantWriteSerializer, responses=TenantSerializer)
    def partial_update(self, request, pk=None):
        tenant = self.get_object()
        data = TenantWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        tenant = services.tenant_update(actor=request.user, tenant=tenant, **data.validated_data)
        return Response(TenantSerializer(tenant).data)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """API tokens: your own; a tenant admin also sees and manages their tenant's; DELETE revokes. Creating is
    rate-limited per user (TOKEN_CREATE_RATE)."""

    serializer_class = ApiTokenSerializer
    throttle_classes = [TokenCreateThrottle]
    filterset_fields = ["scope"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def selector(self, *, user):
        return selectors.token_list(user=user)

    @extend_schema(
        request=ApiTokenCreateSerializer,
        responses={
            201: ApiTokenCreatedSerializer,
            429: OpenApiResponse(
                description="Too many tokens created: wait the Retry-After header's seconds."
            ),
        },
    )
    def create(self, request):
        data = ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        owner = request.user
        username = values.pop("user", None)
        if username and username != request.user.get_username():
            owner = selectors.user_list(user=request.user).filter(username=username).first()
            if owner is None:
                raise ServiceError("no such user that you manage", field="user")
        token, raw = services.token_create(actor=request.user, owner=owner, **values)
        body = ApiTokenCreatedSerializer(token).data
        body["token"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.token_revoke(actor=request.user, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, ScopedViewSet):
    """Users: the provider admin sees all, a tenant admin their tenant's, everyone else themselves. DELETE deactivates."""

    serializer_class = UserSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]

    def selector(self, *, user):
        return selectors.user_list(user=user)

    def tenant_named(self, tenant_id):
        """The tenant the body names (None: none named), where the asker may see it; 400 otherwise."""
        if tenant_id is None:
            return None
        tenant = selectors.tenant_list(user=self.request.user).filter(pk=tenant_id).first()
        if tenant is None:
            raise ServiceError("no such tenant", field="tenant")
        return tenant

    @extend_schema(request=UserCreateSerializer, responses={201: UserCreatedSerializer})
    def create(self, request):
        data = UserCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        tenant = self.tenant_named(values.pop("tenant", None))
        user, generated = services.user_create(actor=request.user, tenant=tenant, **values)
        body = UserCreatedSerializer(selectors.user_list(user=request.user).get(pk=user.pk)).data
        body["password"] = generated
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        """Disable the user: it can no longer log in, its tokens are revoked, it leaves every list."""
        services.user_deactivate(actor=request.user, user=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=UserRoleSerializer, responses=UserSerializer)
    @action(detail=True, methods=["post"])
    def role(self, request, pk=None):
        """Change the user's role (and tenant): 403 for a role the asker may not give, 409 for one's own."""
        user = self.get_object()
        owner_tenant = getattr(getattr(user, "membership", None), "tenant_id", None)
        require(
            principal(request.user).may_manage_user_of(owner_tenant), "You may not change this user's role."
        )
        data = UserRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        role = data.validated_data["role"]
        tenant_id = data.validated_data.get("tenant")
        if tenant_id is None and role not in PROVIDER_ROLES:  # a tenant role in the tenant the user is in
            tenant_id = getattr(getattr(user, "membership", None), "tenant_id", None)
        tenant = self.tenant_named(tenant_id)
        services.user_set_role(actor=request.user, user=user, role=role, tenant=tenant)
        return Response(UserSerializer(selectors.user_list(user=request.user).get(pk=user.pk)).data)

    @extend_schema(request=None, responses=UserPasswordSerializer)
    @action(detail=True, methods=["post"], url_path="reset-password")
    def reset_password(self, request, pk=None):
        """Give a local user a new random password, answered this once."""
        password = services.user_reset_password(actor=request.user, user=self.get_object())
        return Response({"password": password})
