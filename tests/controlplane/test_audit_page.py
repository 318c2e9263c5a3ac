"""The audit page a human can read: a line per write with the change folded under a summary, objects named and
linked to their pages, and pickers of names (not raw ids) for who and what; bad filter values are never a 500."""

import re

import pytest

from controlplane.audit import audit_record
from controlplane.models import AuditEntry
from tenancy import services
from tests.support.factories import make_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture
def trail(users, tenant_a):
    admin = users["provider-admin"]
    cluster = make_cluster(name="gpu-east-7")
    audit_record(
        actor=admin,
        action="cluster.update",
        target=cluster,
        changes={"automation": ["active", "dry_run"], "labels": {"zone": "a", "rack": ["r1", "r2"]}},
    )
    services.tenant_update(actor=admin, tenant=tenant_a, tier="resilient")
    return {"cluster": cluster, "admin": admin}


def options(page: str, name: str) -> dict[str, str]:
    select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', page, re.S)
    assert select, f"no picker for {name}"
    return dict(re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', select[1]))


def test_each_row_is_one_line_with_the_change_folded_and_the_object_linked(client, users, trail):
    client.force_login(users["operator"])
    page = client.get("/audit/").content.decode()
    cluster = trail["cluster"]
    assert f'<a href="/clusters/{cluster.pk}/" title="gpu-east-7">gpu-east-7</a>' in page
    row = re.search(r"<tr[^>]*>(?:(?!</tr>).)*cluster\.update(?:(?!</tr>).)*</tr>", page, re.S)[0]
    summary = re.search(r'<details class="audit-change"><summary>(.*?)</summary><pre>', row, re.S)[1]
    assert "automation: active → dry_run" in summary and "labels" in summary and "\n" not in summary
    assert "&quot;zone&quot;: &quot;a&quot;" in row  # the whole change, under the summary
    assert '<table class="table audit-table">' in page


def test_actor_object_and_tenant_pickers_offer_names(client, users, trail, tenant_a):
    client.force_login(users["operator"])
    page = client.get("/audit/").content.decode()
    actors = options(page, "actor")
    assert actors[""] == "any" and trail["admin"].username in actors
    objects = options(page, "object")
    assert objects[f"fleet.cluster:{trail['cluster'].pk}"] == "cluster gpu-east-7"
    assert options(page, "tenant_id")[str(tenant_a.pk)] == tenant_a.name
    assert "tenancy.tenant" in options(page, "object_type") and "tenant.update" in options(page, "action")
    assert 'type="hidden" name="object_id"' in page  # an id filter stays, for links; it is not typed in


def test_picking_an_object_or_an_actor_filters_the_page_and_the_api(client, api, users, trail):
    cluster = trail["cluster"]
    client.force_login(users["operator"])
    page = client.get("/audit/", {"object": f"fleet.cluster:{cluster.pk}"}).content.decode()
    rows = re.search(r"<tbody.*?</tbody>", page, re.S)[0]
    assert "cluster.update" in rows and "tenant.update" not in rows
    assert f'<option value="fleet.cluster:{cluster.pk}" selected>' in page
    api.as_token(users["operator"], "read")
    rows = api.get("/api/v1/audit/", {"object": f"fleet.cluster:{cluster.pk}"}).json()["results"]
    assert [row["action"] for row in rows] == ["cluster.update"]
    rows = api.get("/api/v1/audit/", {"actor": trail["admin"].username}).json()["results"]
    assert {row["action"] for row in rows} >= {"cluster.update", "tenant.update"}


@pytest.mark.parametrize(
    "query",
    [
        {"object": "nonsense"},
        {"object": ":"},
        {"object": "fleet.cluster:"},
        {"actor": "nobody-at-all"},
        {"tenant_id": "abc"},
        {"object_type": "x" * 500},
        {"object": "a" * 3000},
    ],
)
def test_odd_filter_values_are_never_a_server_error(client, api, users, trail, query):
    client.force_login(users["operator"])
    assert client.get("/audit/", query).status_code in (200, 400)
    api.as_token(users["operator"], "read")
    assert api.get("/api/v1/audit/", query).status_code in (200, 400)


def test_the_pickers_cost_the_same_few_queries_however_long_the_trail(client, users, trail):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.force_login(users["operator"])
    client.get("/audit/")
    with CaptureQueriesContext(connection) as small:
        client.get("/audit/")
    AuditEntry.objects.bulk_create(
        [
            AuditEntry(
                actor_name=f"user-{i}",
                action="thing.do",
                object_type="fleet.node",
                object_id=str(i),
                object_repr=f"node-{i}",
            )
            for i in range(60)
        ]
    )
    with CaptureQueriesContext(connection) as large:
        client.get("/audit/")
    assert len(large.captured_queries) == len(small.captured_queries)
