"""DRF permission classes for DESIGN's permission table: a whole viewset's role check, refused before any
input is read. Each asks a predicate of the Principal (``controlplane.access``), as ``access.require`` does
for one action."""

from rest_framework import permissions

from controlplane.access import principal
from tenancy.models import ApiToken
from tenancy.tokens import scope_allows


class TokenScope(permissions.BasePermission):
    """A read-scoped token may only read."""

    def has_permission(self, request, view):
        token = request.auth
        if isinstance(token, ApiToken) and not scope_allows(token, request.method):
            self.message = f"This token's scope is '{token.scope}'; {request.method} needs a write token."
            return False
        return True


class IsProvider(permissions.BasePermission):
    message = "Only provider roles (provider-admin, operator) may do this."

    def has_permission(self, request, view):
        return principal(request.user).is_provider


class ProviderReadAdminWrite(permissions.BasePermission):
    """Provider roles read; only the provider admin writes."""

    message = "Only the provider admin may change this."

    def has_permission(self, request, view):
        who = principal(request.user)
        if request.method in permissions.SAFE_METHODS:
            return who.is_provider
        return who.is_provider_admin


class ProviderWrites(permissions.BasePermission):
    """Anyone signed in reads (selectors scope what); only provider roles write (DESIGN's permission table)."""

    message = (
        "Only provider roles (provider-admin, operator) may change fleets, clusters, nodes and blueprints."
    )

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or principal(request.user).may_operate
