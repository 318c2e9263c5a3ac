"""Single sign-on with OpenID Connect (mozilla-django-oidc), on when OIDC_CLIENT_ID is set.

The provider's groups decide the Lockstep role and tenant (OIDC_GROUP_ROLES), at every login: a user whose
groups give no role is refused with a page that says so, and no account is made for it. A user is known by the
provider's issuer and subject (tenancy.models.ExternalIdentity), never by a name or an email that a local user
could share. The local login form stays beside it.
"""

import logging
from dataclasses import dataclass
from functools import cache

import requests
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ImproperlyConfigured
from django.shortcuts import render
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView

from controlplane.access import PROVIDER_ROLES, TENANT_ROLES, Role
from controlplane.errors import ServiceError
from tenancy import services
from tenancy.models import Tenant

log = logging.getLogger(__name__)

# The strongest role first: a user in several mapped groups gets the first of these its groups give.
ROLE_ORDER = [Role.PROVIDER_ADMIN, Role.OPERATOR, Role.TENANT_ADMIN, Role.TENANT_VIEWER]


@dataclass(frozen=True)
class Grant:
    role: str
    tenant_slug: str | None = None


class SsoRefused(Exception):
    """A login the provider vouched for that Lockstep refuses; the message is shown to the user."""


def parse_group_roles(text: str) -> dict[str, Grant]:
    """OIDC_GROUP_ROLES (``group=role`` or ``group=role:tenant-slug``, comma-separated) as group -> Grant."""
    grants: dict[str, Grant] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        group, equals, target = (piece.strip() for piece in item.rpartition("="))
        role, _, slug = (piece.strip() for piece in target.partition(":"))
        if not equals or not group:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {item!r} is not GROUP=ROLE or GROUP=ROLE:TENANT")
        if role in PROVIDER_ROLES and slug:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {item!r}: {role} belongs to no tenant")
        if role in TENANT_ROLES and not slug:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {item!r}: {role} needs :TENANT-SLUG")
        if role not in Role.values:
            raise ImproperlyConfigured(f"OIDC_GROUP_ROLES: {item!r}: roles are {', '.join(Role.values)}")
        grants[group] = Grant(role=role, tenant_slug=slug or None)
    return grants


@cache
def group_roles() -> dict[str, Grant]:
    return parse_group_roles(settings.OIDC_GROUP_ROLES)


def groups_of(claims: dict) -> list[str]:
    """The groups claim (OIDC_GROUPS_CLAIM) as a list: providers send a list, some one string."""
    value = claims.get(settings.OIDC_GROUPS_CLAIM) or []
    return [value] if isinstance(value, str) else [str(group) for group in value]


def grant_for(groups: list[str]) -> tuple[str, Tenant | None]:
    """The role and tenant ``groups`` give: the strongest; refused when they give none, or tenant roles in two
    tenants (a user belongs to one), or name a tenant that does not exist."""
    rules = group_roles()
    grants = [rules[group] for group in groups if group in rules]
    if not grants:
        shown = ", ".join(groups) if groups else "none"
        raise SsoRefused(f"None of your groups at the provider ({shown}) gives a role in Lockstep.")
    best = min(grants, key=lambda grant: ROLE_ORDER.index(grant.role))
    if best.role in PROVIDER_ROLES:
        return best.role, None
    slugs = {grant.tenant_slug for grant in grants}
    if len(slugs) > 1:
        raise SsoRefused(f"Your groups give roles in more than one tenant ({', '.join(sorted(slugs))}).")
    tenant = Tenant.objects.filter(slug=best.tenant_slug).first()
    if tenant is None:
        raise SsoRefused(
            f"Your groups give a role in tenant {best.tenant_slug}, which Lockstep does not have."
        )
    return best.role, tenant


class GroupRoleBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, with users found by issuer and subject and their role from their groups."""

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        issuer, subject = payload.get("iss", ""), payload.get("sub", "")
        if not subject or claims.get("sub", subject) != subject:
            return self.refuse(subject, [], "The provider's answer names no user, or two different ones.")
        groups = groups_of(claims)
        try:
            role, tenant = grant_for(groups)
            return services.sso_login(
                issuer=issuer,
                subject=subject,
                username=claims.get("preferred_username") or claims.get("email") or subject,
                email=claims.get("email") or "",
                role=role,
                tenant=tenant,
            )
        except (SsoRefused, ServiceError) as refusal:
            return self.refuse(subject, groups, str(refusal))

    def get_user(self, user_id):
        """The session's user, as for a local login: none once disabled (mozilla-django-oidc's would keep it)."""
        return ModelBackend.get_user(self, user_id)

    def refuse(self, subject: str, groups: list[str], reason: str):
        services.sso_refused(subject=subject, groups=groups, reason=reason)
        self.request.sso_refusal = reason
        return None


class CallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back. A refused login is answered with a page that says why (403); a provider
    that cannot be reached or refuses the code, with one that says so (502, 400), never a server error."""

    def get(self, request):
        try:
            return super().get(request)
        except (requests.ConnectionError, requests.Timeout):
            log.warning("single sign-on: the provider could not be reached", exc_info=True)
            return self.failure("The single sign-on provider could not be reached. Try again later.", 502)
        except requests.HTTPError as error:
            log.warning("single sign-on: the provider refused the code: %s", error)
            return self.failure("The single sign-on provider did not accept this login. Log in again.", 400)

    def login_failure(self):
        reason = getattr(self.request, "sso_refusal", None)
        if reason is not None:
            return self.failure(reason, 403)
        return self.failure("Single sign-on did not complete. Log in again.", 400)

    def failure(self, reason: str, status: int):
        return render(
            self.request,
            "registration/sso_refused.html",
            {"reason": reason, "provider": settings.OIDC_PROVIDER_NAME},
            status=status,
        )
