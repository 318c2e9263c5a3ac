"""The mapping from a provider's groups to a Lockstep role and tenant (OIDC_GROUP_ROLES), and what a single
sign-on makes of a user: found by issuer and subject, its role from its groups again at each login, a disabled
user kept out. The login through a real provider is tests/browser/test_sso.py."""

import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from controlplane.errors import ServiceError
from controlplane.models import AuditEntry
from tenancy import services, sso
from tenancy.models import ApiToken, Membership
from tests.support.factories import make_tenant, make_user, token_header

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "text",
    [
        "admins",  # no role
        "=operator",  # no group
        "admins=wizard",
        "admins=tenant-admin",  # a tenant role needs its tenant
        "admins=operator:acme",  # a provider role has none
    ],
)
def test_malformed_group_roles_are_refused_at_start(text):
    with pytest.raises(ImproperlyConfigured, match="OIDC_GROUP_ROLES"):
        sso.parse_group_roles(text)


def test_group_roles_parse():
    # Spaces and empty items are ignored; a group name may itself hold "=" (an LDAP name): the last one splits.
    rules = sso.parse_group_roles(" sre = operator , cn=acme-ops=tenant-viewer:acme ,")
    assert rules == {"sre": sso.Grant("operator"), "cn=acme-ops": sso.Grant("tenant-viewer", "acme")}


@pytest.fixture
def mapped(settings):
    acme, globex = make_tenant("SSO Acme"), make_tenant("SSO Globex")
    settings.OIDC_GROUP_ROLES = (
        f"root=provider-admin,sre=operator,acme-admins=tenant-admin:{acme.slug},"
        f"acme=tenant-viewer:{acme.slug},globex=tenant-viewer:{globex.slug},ghost=tenant-viewer:no-such-tenant"
    )
    sso.group_roles.cache_clear()
    yield acme, globex
    sso.group_roles.cache_clear()


def test_the_strongest_role_wins(mapped):
    acme, _ = mapped
    assert sso.grant_for(["acme", "acme-admins", "unmapped"]) == ("tenant-admin", acme)
    assert sso.grant_for(["acme", "sre"]) == ("operator", None)
    assert sso.grant_for(["sre", "root"]) == ("provider-admin", None)


@pytest.mark.parametrize(
    "groups, reason",
    [
        ([], "None of your groups at the provider (none) gives a role"),
        (["finance"], "None of your groups at the provider (finance) gives a role"),
        (["acme", "globex"], "more than one tenant"),
        (["ghost"], "tenant no-such-tenant, which Lockstep does not have"),
    ],
)
def test_groups_that_give_no_single_role_are_refused(mapped, groups, reason):
    with pytest.raises(sso.SsoRefused, match=re.escape(reason)):
        sso.grant_for(groups)


def test_groups_claim_may_be_one_string(settings):
    settings.OIDC_GROUPS_CLAIM = "roles"
    assert sso.groups_of({"roles": "sre"}) == ["sre"]
    assert sso.groups_of({"roles": ["a", "b"]}) == ["a", "b"]
    assert sso.groups_of({}) == []


def sign_on(tenant, role="tenant-admin", subject="s-1", username="alice"):
    return services.sso_login(
        issuer="https://idp.example", subject=subject, username=username, email="", role=role, tenant=tenant
    )


def test_sso_user_is_found_by_subject_and_its_role_follows_its_groups(mapped):
    acme, globex = mapped
    user = sign_on(acme)
    assert (user.membership.role, user.membership.tenant_id) == ("tenant-admin", acme.pk)
    assert AuditEntry.objects.get(action="user.create", object_id=str(user.pk)).changes["sso"] is True
    token = ApiToken.objects.create(user=user, name="ci", prefix="p1", digest="d" * 64)

    # The same subject under another name is the same user; moved to another tenant, its tokens go.
    again = sign_on(globex, role="tenant-viewer", username="alice-renamed")
    assert again.pk == user.pk and again.username == "alice"
    membership = Membership.objects.get(user=user)
    assert (membership.role, membership.tenant_id) == ("tenant-viewer", globex.pk)
    token.refresh_from_db()
    assert token.revoked_at is not None
    entry = AuditEntry.objects.get(action="user.role", object_id=str(user.pk))
    assert (
        entry.changes["role"] == ["tenant-admin", "tenant-viewer"] and entry.changes["tokens_revoked"] is True
    )


def test_sso_never_takes_over_a_local_user_of_the_same_name(mapped):
    acme, _ = mapped
    local = make_user("provider-admin", username="alice")
    user = sign_on(acme, username="alice")
    assert user.pk != local.pk and user.username.startswith("alice-")
    assert Membership.objects.get(user=local).role == "provider-admin"


def test_disabled_sso_user_stays_out(mapped, users):
    acme, _ = mapped
    user = sign_on(acme, role="tenant-viewer")
    services.user_deactivate(actor=users["provider-admin"], user=user)
    with pytest.raises(ServiceError, match="disabled") as refused:
        sign_on(acme, role="tenant-admin")
    assert refused.value.status == 403
    user.refresh_from_db()
    assert not user.is_active and Membership.objects.get(user=user).role == "tenant-viewer"


def test_sso_user_has_no_password_to_reset(mapped, users, api):
    acme, _ = mapped
    user = sign_on(acme, role="tenant-viewer")
    api.credentials(**token_header(users["provider-admin"], "write"))
    answer = api.post(f"/api/v1/users/{user.pk}/reset-password/")
    assert answer.status_code == 409 and "single sign-on" in answer.json()["detail"]
