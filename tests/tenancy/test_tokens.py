from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from controlplane.access import Role
from tenancy import services
from tenancy.models import ApiToken
from tenancy.tokens import digest
from tests.support.factories import make_user

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/"


def bearer(raw):
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@pytest.fixture
def admin():
    return make_user(Role.PROVIDER_ADMIN)


def test_token_is_stored_hashed_and_authenticates(api, admin):
    token, raw = services.token_create(actor=admin, owner=admin, name="ci", scope="read")
    row = ApiToken.objects.get(pk=token.pk)
    assert raw not in {row.digest, row.prefix, row.name}
    assert row.digest == digest(raw) and len(row.digest) == 64
    assert raw.startswith(f"lsk_{row.prefix}_")
    response = api.get(URL, **bearer(raw))
    assert response.status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


@pytest.mark.parametrize(
    "header, message",
    [
        ("Bearer", "Malformed Authorization header"),
        ("Bearer a b", "Malformed Authorization header"),
        ("Bearer not-a-lockstep-token", "Malformed bearer token"),
        ("Bearer lsk_abcdefgh_" + "x" * 43, "Unknown token"),
    ],
)
def test_bad_headers_are_refused_with_401_saying_why(api, admin, header, message):
    response = api.get(URL, HTTP_AUTHORIZATION=header)
    assert response.status_code == 401
    assert message in response.json()["detail"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_non_ascii_header_is_401(api):
    response = api.get(URL, HTTP_AUTHORIZATION="Bearer lsk_é".encode().decode("latin-1"))
    assert response.status_code == 401


def test_no_credentials_is_401(api):
    response = api.get(URL)
    assert response.status_code == 401
    assert "credentials were not provided" in response.json()["detail"]


def test_expired_token_is_401(api, admin):
    token, raw = services.token_create(
        actor=admin, owner=admin, name="old", scope="read", expires_at=timezone.now() + timedelta(hours=1)
    )
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = api.get(URL, **bearer(raw))
    assert response.status_code == 401
    assert response.json()["detail"] == "Token has expired."


def test_revoked_token_is_401(api, admin):
    token, raw = services.token_create(actor=admin, owner=admin, name="gone", scope="read")
    services.token_revoke(actor=admin, token=token)
    response = api.get(URL, **bearer(raw))
    assert response.status_code == 401
    assert response.json()["detail"] == "Token has been revoked."


def test_token_of_inactive_user_is_401(api, admin):
    _, raw = services.token_create(actor=admin, owner=admin, name="x", scope="read")
    admin.is_active = False
    admin.save()
    assert api.get(URL, **bearer(raw)).status_code == 401


def test_read_token_cannot_write(api, admin):
    _, raw = services.token_create(actor=admin, owner=admin, name="ro", scope="read")
    response = api.post(URL, {"name": "Initech", "slug": "initech"}, format="json", **bearer(raw))
    assert response.status_code == 403
    assert "scope is 'read'" in response.json()["detail"]
    _, raw_write = services.token_create(actor=admin, owner=admin, name="rw", scope="write")
    assert (
        api.post(URL, {"name": "Initech", "slug": "initech"}, format="json", **bearer(raw_write)).status_code
        == 201
    )


def test_expiry_in_the_past_is_refused(api, admin):
    api.as_token(admin)
    response = api.post("/api/v1/tokens/", {"name": "x", "expires_at": "2001-01-01T00:00:00Z"}, format="json")
    assert response.status_code == 400
    assert "expires_at" in response.json()


def test_token_api_shows_token_once_and_revokes(api, admin):
    api.as_token(admin)
    created = api.post("/api/v1/tokens/", {"name": "deploy", "scope": "write"}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["token"].startswith("lsk_") and body["scope"] == "write"
    listed = api.get("/api/v1/tokens/").json()["results"]
    assert all("token" not in row for row in listed)
    assert api.get(f"/api/v1/tokens/{body['id']}/").json().get("token") is None
    assert api.delete(f"/api/v1/tokens/{body['id']}/").status_code == 204
    api.credentials()
    assert api.get(URL, **bearer(body["token"])).status_code == 401


def test_users_see_only_tokens_they_manage(api, users):
    for user in users.values():
        services.token_create(actor=user, owner=user, name=f"own-{user.username}")
    viewer = users["tenant-viewer"]
    names = {row["user"] for row in api.as_token(viewer, "read").get("/api/v1/tokens/").json()["results"]}
    assert names == {viewer.username}
    tenant_admin = users["tenant-admin"]
    names = {
        row["user"] for row in api.as_token(tenant_admin, "read").get("/api/v1/tokens/").json()["results"]
    }
    assert names == {tenant_admin.username, viewer.username}
    other = ApiToken.objects.filter(user=users["other-viewer"]).first()
    assert api.as_token(tenant_admin).delete(f"/api/v1/tokens/{other.pk}/").status_code == 404
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None


def test_tenant_admin_creates_token_for_own_user_not_others(api, users):
    api.as_token(users["tenant-admin"])
    ok = api.post("/api/v1/tokens/", {"name": "x", "user": users["tenant-viewer"].username}, format="json")
    assert ok.status_code == 201
    refused = api.post(
        "/api/v1/tokens/", {"name": "x", "user": users["other-viewer"].username}, format="json"
    )
    assert refused.status_code == 400 and "user" in refused.json()


def test_createtoken_command_prints_a_working_token(api, admin, capsys):
    call_command("createtoken", admin.username, "--scope", "write")
    raw = capsys.readouterr().out.strip()
    assert raw.startswith("lsk_")
    assert api.get(URL, **bearer(raw)).status_code == 200
    token = ApiToken.objects.get(digest=digest(raw))
    assert token.scope == "write"


def test_token_page_creates_shows_once_and_revokes(client, admin):
    client.force_login(admin)
    page = client.post("/tokens/", {"name": "laptop", "scope": "read"})
    assert page.status_code == 200
    token = ApiToken.objects.get(name="laptop")
    assert f"lsk_{token.prefix}_" in page.content.decode()
    again = client.get("/tokens/").content.decode()
    assert f"lsk_{token.prefix}_…" in again and "copy it now" not in again
    asked = client.post(f"/tokens/{token.pk}/revoke/")  # revoking asks first, and changes nothing yet
    assert asked.status_code == 200 and "cannot be undone" in asked.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is None
    client.post(f"/tokens/{token.pk}/revoke/", {"confirmed": "yes"})
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_token_writes_are_audited(admin):
    from controlplane.models import AuditEntry

    token, _ = services.token_create(actor=admin, owner=admin, name="a")
    services.token_revoke(actor=admin, token=token)
    actions = list(AuditEntry.objects.filter(object_id=str(token.pk)).values_list("action", flat=True))
    assert sorted(actions) == ["token.create", "token.revoke"]


@pytest.mark.parametrize("role", [Role.PROVIDER_ADMIN, Role.TENANT_VIEWER, None])
def test_a_bearer_token_loads_its_user_and_role_in_one_statement(role, tenant_a):
    """The token, its user and the user's membership (or that there is none) come from one statement; the role
    checks that follow ask the database nothing more."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.access import principal
    from tenancy.authentication import user_for_bearer

    if role is None:
        user = get_user_model().objects.create_user("no-membership", password="x" * 20)
    else:
        user = make_user(role, tenant_a if role == Role.TENANT_VIEWER else None)
    _, raw = services.token_create(actor=user, owner=user, name="t", scope="write")
    ApiToken.objects.update(last_used_at=timezone.now())  # no last-used write in the count
    with CaptureQueriesContext(connection) as statements:
        found, token = user_for_bearer(raw)
        who = principal(found)
    assert len(statements) == 1
    assert found.pk == user.pk and token.user_id == user.pk and token.digest == digest(raw)
    if role is None:
        assert not who.is_authenticated
    else:
        assert who.role == role and who.tenant_id == (tenant_a.pk if role == Role.TENANT_VIEWER else None)


def _one_of_each_kind(admin, tenant):
    """A token of every kind, made by the one generator, and the authenticator that checks it."""
    from jobs.authentication import JobTokenAuthentication
    from jobs.launchers import LauncherAuthentication
    from jobs.models import Job, JobToken, LauncherCredential
    from telemetry.authentication import AgentTokenAuthentication
    from telemetry.models import AgentToken
    from tenancy.authentication import BearerTokenAuthentication
    from tests.support.factories import make_cluster

    cluster = make_cluster()
    job = Job.objects.create(tenant=tenant, cluster=cluster, name="j", gpus=8)
    return [
        (BearerTokenAuthentication, services.token_issue(model=ApiToken, user=admin, name="t")),
        (AgentTokenAuthentication, services.token_issue(model=AgentToken, cluster=cluster, name="a")),
        (JobTokenAuthentication, services.token_issue(model=JobToken, job=job)),
        (LauncherAuthentication, services.token_issue(model=LauncherCredential, cluster=cluster, name="l")),
    ]


def test_every_kind_of_token_is_made_hashed_and_noted_as_used_once_per_resolution(admin, tenant_a, settings):
    settings.TOKEN_LAST_USED_RESOLUTION = 3600
    for authentication, (token, raw) in _one_of_each_kind(admin, tenant_a):
        assert raw.split("_")[:2] == [token.kind, token.prefix] and token.digest == digest(raw)
        assert authentication().check(raw).pk == token.pk
        first = type(token).objects.get(pk=token.pk).last_used_at
        assert first is not None
        authentication().check(raw)
        assert type(token).objects.get(pk=token.pk).last_used_at == first  # within the resolution: no write
        settings.TOKEN_LAST_USED_RESOLUTION = 0
        authentication().check(raw)
        assert type(token).objects.get(pk=token.pk).last_used_at > first
        settings.TOKEN_LAST_USED_RESOLUTION = 3600


def test_every_kind_of_token_loads_with_its_related_row_in_one_statement(admin, tenant_a, settings):
    """The lookup is one statement for every kind, its related row (the cluster, the job, the user) comes with it,
    and an agent's token leaves its cluster's driver credentials encrypted and unloaded."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.TOKEN_LAST_USED_RESOLUTION = 3600
    for authentication, (token, raw) in _one_of_each_kind(admin, tenant_a):
        authentication().check(raw)  # the last-used write, out of the count
        with CaptureQueriesContext(connection) as statements:
            found = authentication().check(raw)
            related = [getattr(found, name) for name in authentication.related]
        assert len(statements) == 1, (authentication.__name__, [q["sql"] for q in statements])
        assert found.pk == token.pk and found.digest == digest(raw)
        assert [row.pk if row is not None else None for row in related] == [
            getattr(token, f"{name}_id") for name in authentication.related
        ]
        deferred = related[0].get_deferred_fields() if related and related[0] is not None else set()
        assert deferred == (
            {"connection"} if authentication.__name__ == "AgentTokenAuthentication" else set()
        )
