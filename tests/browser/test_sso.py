"""Single sign-on through a real OpenID Connect provider (the npm oidc-provider, tests/support/oidc.py): Chromium
clicks "Log in with", logs in at the provider and comes back to Lockstep in the tenant and role its groups map to;
a user whose groups map to nothing is refused with a page that says so, and no account is made."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model

from controlplane.audit import AuditEntry
from tenancy.models import ExternalIdentity, Membership
from tests.support import oidc
from tests.support.browser import SERVER_ENV, screenshot
from tests.support.factories import make_tenant
from tests.support.processes import uvicorn_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

User = get_user_model()

ACCOUNTS = {
    "alice": ["acme-admins", "coffee-club"],
    "bob": ["platform-oncall"],
    "mallory": ["finance"],
}


@pytest.fixture
def sso(tmp_path):
    """Lockstep and the provider, running, with acme's and the platform team's groups mapped to roles."""
    acme = make_tenant("Acme")
    make_tenant("Globex")
    provider = oidc.reserve()
    group_roles = (
        f"acme-admins=tenant-admin:{acme.slug},acme-all=tenant-viewer:{acme.slug},platform-oncall=operator"
    )
    with uvicorn_server(tmp_path, **SERVER_ENV, **provider.settings_env(group_roles)) as server:
        callback = f"{server.url}/oidc/callback/"
        with oidc.running(provider, tmp_path, redirect_uri=callback, accounts=ACCOUNTS):
            yield server, acme


def serious_axe(page) -> list[str]:
    found = Axe().run(page).response["violations"]
    return [f"{v['id']}: {v['help']}" for v in found if v["impact"] in ("serious", "critical")]


def sso_log_in(page, server, login: str):
    """From Lockstep's login page through the provider's login and consent, back to Lockstep."""
    page.goto(f"{server.url}/accounts/login/")
    assert page.get_by_label("Password").count() == 1  # the local form stays beside the button
    page.get_by_role("link", name="Log in with Test IdP").click()
    page.locator("input[name=login]").fill(login)
    page.locator("input[name=password]").fill("any-password-the-test-provider-takes")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()
    page.wait_for_url(f"{server.url}/**")


def test_sso_login_lands_in_the_mapped_tenant_and_role_each_time(chromium, sso):
    server, acme = sso
    context = chromium.new_context()
    page = context.new_page()
    sso_log_in(page, server, "alice")
    page.wait_for_url(f"{server.url}/")
    assert page.locator(".who .badge").inner_text() == "tenant-admin"
    screenshot(page, "sso-home-tenant-admin")
    identity = ExternalIdentity.objects.select_related("user__membership").get(subject="alice")
    assert identity.issuer.startswith("http://127.0.0.1:")
    assert identity.user.username == "alice" and not identity.user.has_usable_password()
    assert (identity.user.membership.role, identity.user.membership.tenant_id) == ("tenant-admin", acme.pk)
    context.close()

    # Someone lowered alice's role in Lockstep: her groups give it back at her next login, audited.
    Membership.objects.filter(user=identity.user).update(role="tenant-viewer")
    context = chromium.new_context()
    page = context.new_page()
    sso_log_in(page, server, "alice")
    assert page.locator(".who .badge").inner_text() == "tenant-admin"
    assert AuditEntry.objects.filter(action="user.role", object_id=str(identity.user.pk)).exists()
    context.close()


def test_sso_operator_group_gives_the_provider_role(chromium, sso):
    server, _ = sso
    context = chromium.new_context()
    page = context.new_page()
    sso_log_in(page, server, "bob")
    assert page.locator(".who .badge").inner_text() == "operator"
    membership = Membership.objects.get(user__external_identity__subject="bob")
    assert membership.role == "operator" and membership.tenant_id is None

    # Disabled, bob's session ends, and the provider's word does not bring him back.
    User.objects.filter(pk=membership.user_id).update(is_active=False)
    assert page.goto(f"{server.url}/").url.startswith(f"{server.url}/accounts/login/")
    context.close()
    context = chromium.new_context()
    page = context.new_page()
    sso_log_in(page, server, "bob")
    assert "Your Lockstep account is disabled" in page.locator("#sso-reason").inner_text()
    context.close()


def test_sso_user_whose_groups_map_to_nothing_is_refused_and_not_created(chromium, sso):
    server, _ = sso
    context = chromium.new_context()
    page = context.new_page()
    answers = []
    page.on(
        "response", lambda response: answers.append(response) if "/oidc/callback/" in response.url else None
    )
    sso_log_in(page, server, "mallory")
    assert answers and answers[-1].status == 403
    reason = page.locator("#sso-reason").inner_text()
    assert "None of your groups at the provider (finance) gives a role in Lockstep." == reason
    assert page.get_by_role("heading", name="You cannot log in to Lockstep with Test IdP").count() == 1
    screenshot(page, "sso-refused")
    assert serious_axe(page) == []
    assert not ExternalIdentity.objects.filter(subject="mallory").exists()
    assert AuditEntry.objects.filter(action="login.sso-refused", changes__subject="mallory").count() == 1
    assert page.goto(f"{server.url}/").url.startswith(f"{server.url}/accounts/login/")  # not logged in
    assert page.get_by_role("link", name="Log in with Test IdP").count() == 1
    assert serious_axe(page) == []  # the login page with its single sign-on button
    context.close()
