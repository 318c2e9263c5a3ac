"""Who is asking and what they may do: the one place a role is decided.

A user's Principal (role and tenant) answers DESIGN's permission table, one predicate per row; pages, API
views, services and selectors ask those predicates and compare no roles themselves. A refusal is raised
through ``require``: one exception (``Refused``) that every layer answers 403 with its message, a page as
Django's PermissionDenied, the API and a service's caller as a ServiceError. What of a table a user may see
is ``tenancy.scoping``'s.

The resolver that maps a user to a Principal is registered by the tenancy app (controlplane imports no app);
until it is, only superusers are known (as provider admins).
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db import models

from controlplane.errors import ServiceError


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

    @property
    def manages_users(self) -> bool:
        """The users pages: the provider admin every tenant's users, a tenant admin its own tenant's."""
        return self.is_provider_admin or self.is_tenant_admin

    def may_manage_user_of(self, tenant_id: int | None) -> bool:
        """A user's account or tokens: a user of ``tenant_id`` (None: a provider user) by the provider admin
        or that tenant's admin."""
        return self.is_provider_admin or (tenant_id is not None and self.may_manage_users(tenant_id))


class Refused(PermissionDenied, ServiceError):
    """A refusal for want of a role: 403 with its message in pages, the API and services alike."""

    def __init__(self, detail: str = "", *, field: str | None = None):
        ServiceError.__init__(self, detail, field=field, status=403)


def require(allowed: bool, message: str = "", *, field: str | None = None) -> None:
    """Refuse (``Refused``, 403) unless ``allowed``: the one way a page, API view or service turns a
    predicate of the Principal into a refusal. ``field`` names the input the refusal is about (an API
    answer keys it so)."""
    if not allowed:
        raise Refused(message, field=field)


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
