from typing import ClassVar

from django.conf import settings
from django.db import models
from django.db.models import Q

from controlplane.access import PROVIDER_ROLES, TENANT_ROLES
from tenancy.choices import Role, TenantTier, TokenScope


class Tenant(models.Model):
    """A customer organisation."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)
    tier = models.CharField(max_length=20, choices=TenantTier.choices, default=TenantTier.STANDARD)
    created_at = models.DateTimeField(auto_now_add=True)

    tenant_scope = "pk"

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Membership(models.Model):
    """A user's role: provider side (no tenant) or tenant side (one tenant)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices)

    tenant_scope = "tenant_id"

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(role__in=sorted(PROVIDER_ROLES), tenant__isnull=True)
                    | Q(role__in=sorted(TENANT_ROLES), tenant__isnull=False)
                ),
                name="membership_role_matches_tenant",
            )
        ]

    def __str__(self):
        return f"{self.user} as {self.role}" + (f" of {self.tenant}" if self.tenant_id else "")


class Token(models.Model):
    """What every Lockstep bearer token is (API, agent, job, launcher): ``<kind>_<prefix>_<secret>``, shown once
    at creation; only the SHA-256 digest of the whole token is kept (tenancy.tokens). ``kind`` is its first word."""

    kind: ClassVar[str]

    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True


class ApiToken(Token):
    """A user's bearer token, read-only or read-write, with an optional expiry."""

    kind = "lsk"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.READ)
    expires_at = models.DateTimeField(null=True, blank=True)

    tenant_scope = "user__membership__tenant_id"

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        from django.utils import timezone

        return self.revoked_at is None and (self.expires_at is None or self.expires_at > timezone.now())


class ExternalIdentity(models.Model):
    """The single sign-on account a user logs in with: the provider's issuer and subject (``sub``), which never
    change, unlike the name or email the provider also reports (tenancy.sso)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    tenant_scope = "user__membership__tenant_id"

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="external_identity_unique_subject")
        ]

    def __str__(self):
        return f"{self.subject} at {self.issuer}"
