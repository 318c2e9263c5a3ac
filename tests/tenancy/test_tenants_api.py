import pytest

from controlplane.models import AuditEntry, Event

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/"


@pytest.mark.parametrize(
    "role, list_status, create_status",
    [
        ("provider-admin", 200, 201),
        ("operator", 200, 403),
        ("tenant-admin", 403, 403),
        ("tenant-viewer", 403, 403),
    ],
)
def test_tenants_follow_the_permission_table(api, users, role, list_status, create_status):
    api.as_token(users[role])
    assert api.get(URL).status_code == list_status
    response = api.post(URL, {"name": f"New {role}", "slug": f"new-{role}"}, format="json")
    assert response.status_code == create_status


def test_anonymous_gets_401(api, db):
    assert api.get(URL).status_code == 401


def test_create_is_audited_and_published(api, users):
    api.as_token(users["provider-admin"])
    response = api.post(URL, {"name": "Initech", "slug": "initech", "tier": "resilient"}, format="json")
    assert response.status_code == 201, response.content
    tenant_id = response.json()["id"]
    entry = AuditEntry.objects.get(action="tenant.create", object_id=str(tenant_id))
    assert entry.actor == users["provider-admin"] and entry.source == "api" and entry.token_prefix
    assert entry.changes["tier"] == "resilient"
    topics = set(Event.objects.filter(kind="tenant.created").values_list("topic", flat=True))
    assert topics == {"fleet", f"tenant-{tenant_id}"}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"slug": "x"}, "name"),
        ({"name": "X"}, "slug"),
        ({"name": "X", "slug": "not a slug!"}, "slug"),
        ({"name": "X", "slug": "x", "tier": "platinum"}, "tier"),
        ({"name": "Acme", "slug": "acme-2"}, "name"),
        ({"name": "x" * 101, "slug": "x"}, "name"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_writes_nothing(api, users, body, field):
    api.as_token(users["provider-admin"])
    before = (AuditEntry.objects.count(), Event.objects.count())
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert (AuditEntry.objects.count(), Event.objects.count()) == before


@pytest.mark.parametrize(
    "payload, content_type",
    [("{not json", "application/json"), ("name=x", "text/plain"), ("[]", "application/json")],
)
def test_malformed_bodies_are_4xx(api, users, payload, content_type):
    api.as_token(users["provider-admin"])
    response = api.generic("POST", URL, payload, content_type=content_type)
    assert 400 <= response.status_code < 500


def test_patch_updates_and_audits(api, users, tenant_a):
    api.as_token(users["provider-admin"])
    response = api.patch(f"{URL}{tenant_a.pk}/", {"tier": "resilient"}, format="json")
    assert response.status_code == 200 and response.json()["tier"] == "resilient"
    entry = AuditEntry.objects.get(action="tenant.update")
    assert entry.changes == {"tier": ["standard", "resilient"]}


def test_unknown_api_path_is_json_404(api, users):
    api.as_token(users["operator"])
    response = api.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}


def test_users_api_scoped_and_created_by_tenant_admin(api, users, tenant_a, tenant_b):
    api.as_token(users["tenant-admin"])
    names = {row["username"] for row in api.get("/api/v1/users/").json()["results"]}
    assert names == {users["tenant-admin"].username, users["tenant-viewer"].username}
    created = api.post(
        "/api/v1/users/",
        {"username": "new-viewer", "role": "tenant-viewer", "tenant": tenant_a.pk},
        format="json",
    )
    assert created.status_code == 201 and created.json()["password"]
    into_other = api.post(
        "/api/v1/users/",
        {"username": "sneaky", "role": "tenant-viewer", "tenant": tenant_b.pk},
        format="json",
    )
    assert into_other.status_code == 400 and "tenant" in into_other.json()
    provider = api.post("/api/v1/users/", {"username": "sneaky2", "role": "operator"}, format="json")
    assert provider.status_code == 403
