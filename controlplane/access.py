"""Who is asking: the role and tenant of a user, as every page, endpoint and topic check sees them.

Roles are DESIGN's permission table. The resolver that maps a user to a Principal is registered by the
tenancy app (controlplane imports no app); until it is, only superusers are known (as provider admins).
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.db import models


class Role(models.TextChoices):
    PROVIDER_ADMIN = "provider-admin", "Provider admin"
    OPERATOR = "operator", "Operator"
    TENANT_ADMIN = "tenant-admin", "Tenant admin"
    TENANT_VIEWER = "tenant-viewer", "Tenant viewer"


PROVIDER_ROLES = frozenset({Role.PROVIDER_ADMIN, Role.OPERATOR})
TENANT_ROLES = frozenset({Role.TENANT_ADMIN, Role.TENANT_VIEWER})


@dataclass(frozen=True)
class Principal:
    user_id: int | None
    role: str | None
    tenant_id: int | None

    @property
    def is_authenticated(self) -> bool:
        return self.user_id is not None and self.role is not None

    @property
    def is_provider(self) -> bool:
        return self.role in PROVIDER_ROLES

    @property
    def is_provider_admin(self) -> bool:
        return self.role == Role.PROVIDER_ADMIN

    @property
    def is_tenant_admin(self) -> bool:
        return self.role == Role.TENANT_ADMIN

    def in_tenant(self, tenant_id: int | None) -> bool:
        return tenant_id is not None and self.role in TENANT_ROLES and self.tenant_id == tenant_id

    # DESIGN's permission table, one predicate per row.
    @property
    def sees_fleet(self) -> bool:
        return self.is_provider

    @property
    def may_operate(self) -> bool:
        """Blueprints, rollouts, cordon/drain, report faults, snapshots, automation switches."""
        return self.is_provider

    @property
    def may_read_audit(self) -> bool:
        return self.is_provider

    def may_submit_jobs(self, tenant_id: int | None) -> bool:
        return self.is_provider or (self.role == Role.TENANT_ADMIN and self.tenant_id == tenant_id)

    def may_manage_users(self, tenant_id: int | None) -> bool:
        return self.is_provider_admin or (self.role == Role.TENANT_ADMIN and self.tenant_id == tenant_id)


ANONYMOUS = Principal(user_id=None, role=None, tenant_id=None)

_resolver: Callable[[object], Principal] | None = None


def register_principal_resolver(resolver: Callable[[object], Principal]) -> None:
    global _resolver
    _resolver = resolver


def principal(user) -> Principal:
    """The Principal for a user (cached on the user object for the request)."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", True):
        return ANONYMOUS
    cached = getattr(user, "_lockstep_principal", None)
    if cached is not None:
        return cached
    if _resolver is not None:
        found = _resolver(user)
    elif user.is_superuser:
        found = Principal(user_id=user.pk, role=Role.PROVIDER_ADMIN, tenant_id=None)
    else:
        found = ANONYMOUS
    user._lockstep_principal = found
    return found
