from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from controlplane.access import Principal, Role, principal
from tenancy.models import ApiToken, Membership, Tenant
from tenancy.scoping import restrict

User = get_user_model()


def principal_for_user(user) -> Principal:
    """The resolver registered with controlplane.access: a user's role and tenant from their membership."""
    if "membership" in user._state.fields_cache:  # fetched with the user (the bearer-token lookup does)
        membership = user._state.fields_cache["membership"]
        row = (membership.role, membership.tenant_id) if membership is not None else None
    else:
        row = Membership.objects.filter(user_id=user.pk).values_list("role", "tenant_id").first()
    if row is not None:
        return Principal(user_id=user.pk, role=row[0], tenant_id=row[1])
    if user.is_superuser:
        return Principal(user_id=user.pk, role=Role.PROVIDER_ADMIN, tenant_id=None)
    return Principal(user_id=user.pk, role=None, tenant_id=None)


def tenant_list(*, user) -> QuerySet[Tenant]:
    return restrict(Tenant.objects.all(), user)


def token_list(*, user) -> QuerySet[ApiToken]:
    """Tokens the user may manage: their own; a tenant admin's tenant's; all for the provider admin."""
    who = principal(user)
    rows = ApiToken.objects.select_related("user")
    if who.manages_users:
        return restrict(rows, user)
    return rows.filter(user_id=user.pk) if who.is_authenticated else rows.none()


def user_list(*, user) -> QuerySet:
    """Users the user may manage (``manages_users``: the provider admin all, a tenant admin its tenant's);
    anyone else signed in sees only themselves. Disabled (removed) users are in no list."""
    who = principal(user)
    rows = (
        User.objects.filter(is_active=True)
        .select_related("membership", "membership__tenant", "external_identity")
        .order_by("username")
    )
    if who.manages_users:
        return restrict(rows, user, scope="membership__tenant_id")
    return rows.filter(pk=user.pk) if who.is_authenticated else rows.none()


def tenant_members(*, user, tenant_id: int) -> QuerySet[Membership]:
    """A tenant's members by user name, disabled ones left out: for provider roles and that tenant's own users."""
    return (
        restrict(Membership.objects.filter(tenant_id=tenant_id, user__is_active=True), user)
        .select_related("user")
        .order_by("user__username")
    )


def tenant_of(*, user, tenant_id: int) -> Tenant:
    """The tenant, where the user may see it (Tenant.DoesNotExist otherwise)."""
    return tenant_list(user=user).get(pk=tenant_id)
