from django.contrib import admin

from controlplane.admin_readonly import ReadOnlyAdmin
from tenancy.models import ApiToken, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "tier", "created_at"]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    """Roles change through the user services (audited), not here."""

    list_display = ["user", "role", "tenant"]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens are created, revoked and rotated through the services (audited; a revocation closes open
    websockets): here they are only looked at, and the digest is never shown."""

    list_display = ["name", "prefix", "user", "scope", "expires_at", "last_used_at", "revoked_at"]
    exclude = ["digest"]
