import pytest

from controlplane.models import AuditEntry
from tenancy import services

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "role, status",
    [("provider-admin", 200), ("operator", 200), ("tenant-admin", 403), ("tenant-viewer", 403)],
)
def test_audit_api_is_for_provider_roles(api, users, role, status):
    api.as_token(users[role], "read")
    assert api.get("/api/v1/audit/").status_code == status


def test_audit_records_who_what_when_and_change_from_a_page(client, users):
    admin = users["provider-admin"]
    client.force_login(admin)
    client.post("/tokens/", {"name": "from-page", "scope": "read"})
    entry = AuditEntry.objects.get(action="token.create", changes__name="from-page")
    assert entry.actor == admin and entry.source == "page" and entry.created_at
    assert entry.changes["scope"] == "read"


def test_audit_api_filters(api, users, tenant_a):
    admin = users["provider-admin"]
    services.tenant_update(actor=admin, tenant=tenant_a, tier="resilient")
    api.as_token(admin, "read")
    rows = api.get("/api/v1/audit/", {"action": "tenant.update"}).json()["results"]
    assert len(rows) == 1 and rows[0]["changes"] == {"tier": ["standard", "resilient"]}
    assert rows[0]["source"] == "system"


def test_audit_is_written_in_the_same_transaction_as_the_change(users, tenant_a):
    from controlplane.errors import ServiceError

    before = AuditEntry.objects.count()
    with pytest.raises(ServiceError):
        services.tenant_update(actor=users["operator"], tenant=tenant_a, tier="resilient")
    assert AuditEntry.objects.count() == before


def test_audit_page_sorts_filters_and_paginates(client, users, tenant_a):
    admin = users["provider-admin"]
    for tier in ("resilient", "standard", "resilient"):
        services.tenant_update(actor=admin, tenant=tenant_a, tier=tier)
    client.force_login(users["operator"])
    page = client.get("/audit/", {"action": "tenant.update", "sort": "created_at"}).content.decode()
    assert page.count("<tr") == 4  # header + three updates
    assert "tenant.update" in page and "user.create" not in page
    assert "orderable" in page or "sort=" in page
    empty = client.get("/audit/", {"action": "nothing.like.this"}).content.decode()
    assert "Nothing matches" in empty


@pytest.mark.parametrize(
    "query", [{"since": "1276-08-10T14:34:37+23:28"}, {"until": "6201-01-29T03:09:34-23:03"}]
)
def test_out_of_range_filters_are_400_in_the_api(api, users, query):
    api.as_token(users["operator"], "read")
    response = api.get("/api/v1/audit/", query)
    assert response.status_code == 400 and "out of the range" in response.json()["detail"]


def test_out_of_range_filters_are_400_on_the_page(client, users):
    client.force_login(users["operator"])
    assert client.get("/audit/", {"until": "6201-01-29T03:09:34-23:03"}).status_code == 400


def test_database_unavailable_is_503_with_retry_after_not_a_server_error(api, client, users, monkeypatch):
    """The mapping alone (the stack-fault tests stop a real PostgreSQL): an OperationalError from the database
    layer answers 503 + Retry-After in the API and on pages."""
    from django.db import OperationalError

    from controlplane import selectors

    def unreachable(**_):
        raise OperationalError("connection failed: server closed the connection unexpectedly")

    monkeypatch.setattr(selectors, "audit_list", unreachable)
    api.as_token(users["operator"], "read")
    response = api.get("/api/v1/audit/")
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert "try again" in response.json()["detail"]
    client.force_login(users["operator"])
    page = client.get("/audit/")
    assert page.status_code == 503 and "try again" in page.content.decode()
