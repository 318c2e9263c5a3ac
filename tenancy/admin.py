from django.contrib import admin

from tenancy.models import ApiToken, Membership, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "tier", "created_at"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "role", "tenant"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "user", "scope", "expires_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "digest", "last_used_at"]
