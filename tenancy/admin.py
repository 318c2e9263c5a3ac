from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.admin_readonly import ReadOnlyAdmin
from tenancy.models import ApiToken, Membership, Tenant

User = get_user_model()

# Django's own user and group forms write users, passwords, staff and superuser flags and permissions directly:
# no role (Membership), no audit entry, a deactivation that leaves tokens and websockets open (issue 54). Users
# are created, changed and deactivated through the tenancy services (the Users page, the API, manage.py).
for model in (User, Group):
    if admin.site.is_registered(model):
        admin.site.unregister(model)


@admin.register(User)
class UserAdmin(ReadOnlyAdmin):
    """Users, to look at: the password hash is never shown."""

    list_display = ["username", "email", "is_active", "is_staff", "is_superuser", "last_login", "date_joined"]
    search_fields = ["username", "email"]
    fields = [
        "username",
        "email",
        "first_name",
        "last_name",
        "is_active",
        "is_staff",
        "is_superuser",
        "last_login",
        "date_joined",
    ]


@admin.register(Group)
class GroupAdmin(ReadOnlyAdmin):
    """Lockstep's roles are memberships, not groups: groups are not used, and not granted here."""

    list_display = ["name"]
    exclude = ["permissions"]


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
