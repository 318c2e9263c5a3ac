"""The users page in a real browser: a tenant admin changes a user's role and disables another, who then is gone
from the users page and the tenant home and cannot log in; the provider admin adds an operator and resets a
password, each shown once; axe finds nothing serious on the page."""

import pytest
from axe_playwright_python.sync_playwright import Axe

from controlplane.audit import AuditEntry
from tenancy.models import Membership
from tests.support.browser import log_in, screenshot, usable_password
from tests.support.factories import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PASSWORD = "correct-horse-9"


def serious_axe(page) -> list[str]:
    found = Axe().run(page).response["violations"]
    return [
        f"{v['id']}: {v['help']} {v['nodes'][0]['target']}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


def row(page, user):
    return page.locator(f"#user-table tr[data-user='{user.pk}']")


def test_tenant_admin_changes_a_role_and_disables_a_user(page, server, users):
    admin, viewer = users["tenant-admin"], users["tenant-viewer"]
    leaving = make_user("tenant-viewer", admin.membership.tenant, username="leaving-viewer")
    usable_password(admin, PASSWORD)
    usable_password(leaving, PASSWORD)
    log_in(page, server.url, admin.username, PASSWORD)
    assert "leaving-viewer" in page.locator("main").inner_text()  # the tenant home lists its users
    page.goto(f"{server.url}/users/")
    # A tenant admin gives only its tenant's roles.
    options = row(page, viewer).locator("select[name=role] option").all_inner_texts()
    assert options == ["Tenant admin", "Tenant viewer"]
    assert page.locator("#id_role option").all_inner_texts() == ["Tenant admin", "Tenant viewer"]

    row(page, viewer).get_by_label(f"Role of {viewer.username}").select_option("tenant-admin")
    row(page, viewer).get_by_role("button", name="Change role").click()
    page.wait_for_url(f"{server.url}/users/")
    assert f"{viewer.username} is now Tenant admin" in page.get_by_role("main").inner_text()
    assert row(page, viewer).locator(".user-role").inner_text() == "Tenant admin"
    assert Membership.objects.get(user=viewer).role == "tenant-admin"
    assert AuditEntry.objects.filter(action="user.role", object_id=str(viewer.pk), actor=admin).count() == 1

    row(page, leaving).get_by_role("button", name="Disable").click()
    assert "Disable leaving-viewer?" in page.locator("#confirm-question").inner_text()
    page.locator("#confirm-yes").click()
    page.wait_for_url(f"{server.url}/users/")
    assert "leaving-viewer disabled." in page.get_by_role("main").inner_text()
    assert row(page, leaving).count() == 0
    screenshot(page, "users-after-disable")
    page.goto(f"{server.url}/")
    assert "leaving-viewer" not in page.locator("main").inner_text()
    assert AuditEntry.objects.filter(action="user.deactivate", object_id=str(leaving.pk)).count() == 1

    # The disabled user cannot log in.
    page.context.clear_cookies()
    page.goto(f"{server.url}/accounts/login/")
    page.get_by_label("User name").fill("leaving-viewer")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    assert page.get_by_role("alert").inner_text().startswith("Your user name and password did not match")


def test_provider_admin_adds_an_operator_and_resets_a_password(page, server, users):
    admin, viewer = users["provider-admin"], users["tenant-viewer"]
    usable_password(admin, PASSWORD)
    log_in(page, server.url, admin.username, PASSWORD)
    page.goto(f"{server.url}/users/")
    assert serious_axe(page) == []
    roles = page.locator("#id_role option").all_inner_texts()
    assert roles == ["Provider admin", "Operator", "Tenant admin", "Tenant viewer"]

    page.get_by_label("Username").fill("night-operator")
    page.locator("#id_role").select_option("operator")
    page.locator("#user-add").click()
    created = page.locator("#user-created")
    assert "night-operator added" in created.inner_text()
    assert len(page.locator("#new-password").inner_text()) >= 16
    assert Membership.objects.get(user__username="night-operator").role == "operator"
    assert serious_axe(page) == []

    row(page, viewer).get_by_role("button", name="Reset password").click()
    page.locator("#confirm-yes").click()
    password = page.locator("#reset-password").inner_text()
    assert f"New password for {viewer.username}" in page.locator("#password-reset").inner_text()
    screenshot(page, "users-password-reset")
    assert serious_axe(page) == []
    assert AuditEntry.objects.filter(action="user.password-reset", object_id=str(viewer.pk)).count() == 1

    # The viewer logs in with the new password (in a browser of its own).
    other = page.context.browser.new_context()
    try:
        log_in(other.new_page(), server.url, viewer.username, password)
    finally:
        other.close()
