"""User management by pages and API: who may give which role, change it, reset a password and disable a user;
every change audited; refusals 403, another tenant's user 404, bad input 400; disabled users in no list."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from controlplane.models import AuditEntry
from tenancy import selectors
from tenancy.models import Membership

pytestmark = pytest.mark.django_db

User = get_user_model()
CONFIRMED = {"confirmed": "yes"}


def page_as(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- refusals: a tenant admin gives only its tenant's roles, touches only its tenant's users --------------------


@pytest.mark.parametrize("role", ["operator", "provider-admin"])
def test_tenant_admin_cannot_create_a_provider_role(api, users, role):
    admin = users["tenant-admin"]
    assert page_as(admin).post("/users/", {"username": "sneaky", "role": role}).status_code == 403
    answer = api.as_token(admin).post("/api/v1/users/", {"username": "sneaky", "role": role}, format="json")
    assert answer.status_code == 403, answer.content
    target = users["tenant-viewer"]
    assert page_as(admin).post(f"/users/{target.pk}/role/", {"role": role}).status_code == 403
    assert api.post(f"/api/v1/users/{target.pk}/role/", {"role": role}, format="json").status_code == 403
    assert not User.objects.filter(username="sneaky").exists()
    assert Membership.objects.get(user=target).role == "tenant-viewer"


@pytest.mark.parametrize(
    "path, body",
    [
        ("/users/{pk}/role/", {"role": "tenant-admin"}),
        ("/users/{pk}/password/", CONFIRMED),
        ("/users/{pk}/remove/", CONFIRMED),
    ],
)
def test_tenant_admin_cannot_touch_another_tenants_user_page(users, path, body):
    other = users["other-viewer"]
    answer = page_as(users["tenant-admin"]).post(path.format(pk=other.pk), body)
    assert answer.status_code == 404
    other.refresh_from_db()
    assert other.is_active and Membership.objects.get(user=other).role == "tenant-viewer"


def test_tenant_admin_cannot_touch_another_tenants_user_api(api, users):
    other = users["other-viewer"]
    api.as_token(users["tenant-admin"])
    assert (
        api.post(f"/api/v1/users/{other.pk}/role/", {"role": "tenant-admin"}, format="json").status_code
        == 404
    )
    assert api.post(f"/api/v1/users/{other.pk}/reset-password/").status_code == 404
    assert api.delete(f"/api/v1/users/{other.pk}/").status_code == 404
    # Nor move its own user into the other tenant.
    mine = users["tenant-viewer"]
    body = {"role": "tenant-viewer", "tenant": users["other-admin"].membership.tenant_id}
    assert api.post(f"/api/v1/users/{mine.pk}/role/", body, format="json").status_code in (400, 403)
    assert Membership.objects.get(user=mine).tenant_id == users["tenant-admin"].membership.tenant_id


def test_viewer_and_operator_manage_no_users(api, users):
    target = users["tenant-viewer"]
    for role in ("tenant-viewer", "operator"):
        assert (
            page_as(users[role]).post(f"/users/{target.pk}/role/", {"role": "tenant-admin"}).status_code
            == 403
        )
        assert page_as(users[role]).get("/users/").status_code == 403


# --- bad input: 400 with the field named -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        ({"username": "x", "role": "wizard"}, "role"),
        ({"username": "no spaces", "role": "operator"}, "username"),
        ({"username": "ok-name", "role": "tenant-viewer"}, "tenant"),
        ({"username": "ok-name", "role": "tenant-viewer", "tenant": "abc"}, "tenant"),
        ({"username": "ok-name", "role": "tenant-viewer", "tenant": "999999"}, "tenant"),
    ],
)
def test_bad_input_is_400_on_the_page(users, body, field):
    answer = page_as(users["provider-admin"]).post("/users/", body)
    assert answer.status_code == 400
    assert field in answer.context["form"].errors
    assert not User.objects.filter(username=body["username"]).exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"role": "wizard"}, "role"),
        ({"role": "tenant-viewer"}, "tenant"),
        ({"role": "operator", "tenant": 1}, "tenant"),
        ({"role": "tenant-viewer", "tenant": "abc"}, "tenant"),
        ({"role": "tenant-viewer", "tenant": 999999}, "tenant"),
    ],
)
def test_bad_role_change_is_400_in_the_api(api, users, body, field):
    target = users["operator"]
    answer = api.as_token(users["provider-admin"]).post(
        f"/api/v1/users/{target.pk}/role/", body, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert field in answer.json()


def test_bad_role_change_is_400_on_the_page(users):
    target = users["tenant-viewer"]
    answer = page_as(users["provider-admin"]).post(f"/users/{target.pk}/role/", {"role": "wizard"})
    assert answer.status_code == 400
    answer = page_as(users["provider-admin"]).post(f"/users/{target.pk}/role/", {"role": "tenant-admin"})
    assert answer.status_code == 400 and b"Choose the tenant" in answer.content


def test_own_role_is_not_changed(users):
    admin = users["tenant-admin"]
    answer = page_as(admin).post(f"/users/{admin.pk}/role/", {"role": "tenant-viewer"})
    assert answer.status_code == 409
    assert Membership.objects.get(user=admin).role == "tenant-admin"


# --- what each may do, audited ----------------------------------------------------------------------------------


def test_provider_admin_creates_an_operator_and_changes_roles(api, users):
    admin = users["provider-admin"]
    answer = page_as(admin).post(
        "/users/", {"username": "new-op", "email": "op@example.test", "role": "operator"}
    )
    assert answer.status_code == 200 and answer.context["created"]["password"]
    created = User.objects.get(username="new-op")
    assert Membership.objects.get(user=created).role == "operator"
    assert (
        AuditEntry.objects.get(action="user.create", object_id=str(created.pk)).changes["role"] == "operator"
    )

    # Into a tenant, then back out: each change audited with before and after.
    tenant_id = users["tenant-admin"].membership.tenant_id
    answer = page_as(admin).post(f"/users/{created.pk}/role/", {"role": "tenant-admin", "tenant": tenant_id})
    assert answer.status_code == 302
    membership = Membership.objects.get(user=created)
    assert (membership.role, membership.tenant_id) == ("tenant-admin", tenant_id)
    answer = api.as_token(admin).post(
        f"/api/v1/users/{created.pk}/role/", {"role": "operator"}, format="json"
    )
    assert (
        answer.status_code == 200 and answer.json()["role"] == "operator" and answer.json()["tenant"] is None
    )
    changes = [e.changes for e in AuditEntry.objects.filter(action="user.role", object_id=str(created.pk))]
    assert {"role": ["operator", "tenant-admin"], "tenant": [None, tenant_id]} in changes
    assert {"role": ["tenant-admin", "operator"], "tenant": [tenant_id, None]} in changes


def test_tenant_admin_creates_and_promotes_in_its_tenant(api, users):
    admin = users["tenant-admin"]
    answer = page_as(admin).post("/users/", {"username": "acme-new", "role": "tenant-viewer"})
    assert answer.status_code == 200
    created = User.objects.get(username="acme-new")
    assert Membership.objects.get(user=created).tenant_id == admin.membership.tenant_id
    answer = api.as_token(admin).post(
        f"/api/v1/users/{created.pk}/role/", {"role": "tenant-admin"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert Membership.objects.get(user=created).role == "tenant-admin"
    assert AuditEntry.objects.filter(action="user.role", object_id=str(created.pk), actor=admin).exists()


def test_password_reset_shows_a_new_password_once(api, users):
    target = users["tenant-viewer"]
    client = page_as(users["tenant-admin"])
    asked = client.post(f"/users/{target.pk}/password/")
    assert asked.status_code == 200 and b"Reset password" in asked.content
    target.refresh_from_db()
    assert target.check_password("correct-horse-9")  # nothing changed before the confirmation
    answer = client.post(f"/users/{target.pk}/password/", CONFIRMED)
    password = answer.context["reset"]["password"]
    target.refresh_from_db()
    assert (
        len(password) >= 16
        and target.check_password(password)
        and not target.check_password("correct-horse-9")
    )
    assert AuditEntry.objects.filter(action="user.password-reset", object_id=str(target.pk)).count() == 1
    assert password not in str(AuditEntry.objects.filter(object_id=str(target.pk)).values_list("changes"))

    answer = api.as_token(users["tenant-admin"]).post(f"/api/v1/users/{target.pk}/reset-password/")
    target.refresh_from_db()
    assert answer.status_code == 200 and target.check_password(answer.json()["password"])


def test_disabled_user_is_in_no_list(api, users):
    admin, target = users["tenant-admin"], users["tenant-viewer"]
    tenant_id = admin.membership.tenant_id
    assert page_as(admin).post(f"/users/{target.pk}/remove/", CONFIRMED).status_code == 302
    target.refresh_from_db()
    assert not target.is_active
    assert AuditEntry.objects.filter(action="user.deactivate", object_id=str(target.pk)).exists()
    assert target not in selectors.user_list(user=admin)
    assert target not in [m.user for m in selectors.tenant_members(user=admin, tenant_id=tenant_id)]
    page = page_as(admin).get("/users/")
    assert target.username not in page.content.decode()
    listed = api.as_token(admin).get("/api/v1/users/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert target.username not in [row["username"] for row in rows]
    assert api.get(f"/api/v1/users/{target.pk}/").status_code == 404
    assert (
        page_as(users["provider-admin"])
        .post(f"/users/{target.pk}/role/", {"role": "tenant-admin"})
        .status_code
        == 404
    )
