from rest_framework import permissions

from controlplane.access import principal


class ProviderWrites(permissions.BasePermission):
    """Anyone signed in reads (selectors scope what); only provider roles write (DESIGN's permission table)."""

    message = "Only provider roles (provider-admin, operator) may change fleets, clusters, nodes and blueprints."

    def has_permission(self, request, view):
        return request.method in permissions.SAFE_METHODS or principal(request.user).may_operate
