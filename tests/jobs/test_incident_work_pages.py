"""The incident list page (filters in words, scoped, no 500 on bad input), the incident page's work card and its
actions, notes in Markdown shown safely, and the medians of time to acknowledge, recover and resolve computed
from known timestamps on the home page and in /metrics."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import AuditEntry
from jobs.models import Incident
from jobs.selectors import incident_medians
from tests.support.incidents import incident_world
from tests.support.jobs import node_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tenant_a, tenant_b):
    return incident_world(tenant_a, tenant_b)


def listed(client, query: str = "") -> list[int]:
    response = client.get(f"/incidents/{query}")
    assert response.status_code == 200, response.content[:300]
    return [int(pk) for pk in re.findall(r'data-incident="(\d+)"', response.content.decode())]


def test_the_list_filters_in_words_and_shows_a_tenant_only_its_own(client, users, world):
    pk = {name: incident.pk for name, incident in world.incidents.items()}
    Incident.objects.filter(pk=pk["globex"]).update(work_state="acknowledged", acknowledged_at=timezone.now())
    client.force_login(users["operator"])
    assert sorted(listed(client)) == sorted(pk.values())
    page = client.get("/incidents/").content.decode()
    assert "---------" not in page
    table = page.split('id="incident-list"')[1]  # the rows, not the filter's choices
    assert "Still reporting or recovering" in table and "Recovered (reports stopped)" in table
    assert "GPU Xid error 79" in table and "New, not acknowledged" in table
    assert listed(client, "?work_state=acknowledged") == [pk["globex"]]
    assert sorted(listed(client, f"?tenant={world.jobs['acme'].tenant_id}")) == sorted(
        [pk["acme"], pk["shared-acme"]]
    )
    assert listed(client, f"?q={world.incidents['globex'].node.hostname}") == [pk["globex"]]
    assert listed(client, f"?q=%23{pk['idle']}") == [pk["idle"]]
    assert listed(client, "?kind=thermal") == [pk["idle"]]
    assert listed(client, f"?job={world.jobs['globex'].pk}") == [pk["globex"]]
    after = (world.incidents["shared-globex"].opened_at - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert sorted(listed(client, f"?opened_after={after}")) == sorted([pk["shared-globex"], pk["idle"]])
    assert listed(client, "?q=%23" + "9" * 40 + f"&job={10**30}") == []
    bad = client.get("/incidents/?opened_after=yesterday&cluster=nope&work_state=sleeping")
    assert bad.status_code == 200 and "Enter a valid date/time" in bad.content.decode()

    client.force_login(users["tenant-viewer"])
    assert sorted(listed(client)) == sorted([pk["acme"], pk["shared-acme"]])
    assert listed(client, f"?q=%23{pk['globex']}") == []


def test_the_incident_page_works_it_and_shows_notes_safely(client, users, world):
    incident = world.incidents["acme"]
    page = f"/incidents/{incident.pk}/"
    client.force_login(users["operator"])
    body = client.get(page).content.decode()
    assert 'id="incident-acknowledge"' in body and 'id="incident-resolve-form"' in body
    answer = client.post(f"{page}acknowledge/")
    assert answer.status_code == 302 and answer["Location"].startswith(page)
    note = "Swapped **GPU 3**. <script>alert(1)</script> [click](javascript:alert(2))"
    assert client.post(f"{page}note/", {"body": note}).status_code == 302
    assert (
        client.post(f"{page}resolve/", {"cause": "gremlins"}).status_code == 302
    )  # refused: said on the page
    assert Incident.objects.get(pk=incident.pk).work_state == "acknowledged"
    assert client.post(f"{page}resolve/", {"cause": "fabric"}).status_code == 302
    body = client.get(page).content.decode()
    assert "Resolved by a person" in body and "Fabric (NIC, link, switch)" in body
    assert "<strong>GPU 3</strong>" in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<script>alert(1)" not in body and 'href="javascript:' not in body
    assert 'id="incident-reopen"' in body and 'id="incident-acknowledge"' not in body
    assert AuditEntry.objects.filter(action__startswith="incident.").count() == 3

    # A viewer reads the card without its controls and is refused the posts; another tenant's is a 404.
    client.force_login(users["tenant-viewer"])
    body = client.get(page).content.decode()
    assert (
        'id="incident-work"' in body
        and "<form" not in body.split('id="incident-work"')[1].split("</section>")[0]
    )
    for action in ("acknowledge", "assign", "note", "resolve", "reopen"):
        assert client.post(f"{page}{action}/", {"body": "x", "cause": "unknown"}).status_code == 403, action
    client.force_login(users["other-admin"])
    for action in ("acknowledge", "note", "reopen"):
        assert client.post(f"{page}{action}/", {"body": "x"}).status_code == 404, action


def _at(opened, **after_minutes):
    return {f: opened + timedelta(minutes=m) for f, m in after_minutes.items()}


def test_medians_come_from_the_incidents_own_times(client, api, users, world):
    """Known times: on acme's cluster three incidents acknowledged after 2, 4 and 30 minutes (median 4) and
    resolved after 10 and 50 (median 30); one on globex's acknowledged after 6. Fleet: acknowledge 5 (2, 4, 6,
    30), resolve 30, recover 6 (2, 6, 12)."""
    Incident.objects.all().delete()
    opened = timezone.now() - timedelta(days=2)
    acme_node, globex_node = node_of(world.jobs["acme"]), node_of(world.jobs["globex"])
    rows = [
        (acme_node, _at(opened, acknowledged_at=2, closed_at=10, resolved_at=6)),
        (acme_node, _at(opened, acknowledged_at=4, closed_at=50, resolved_at=2)),
        (acme_node, _at(opened, acknowledged_at=30)),
        (globex_node, _at(opened, acknowledged_at=6, resolved_at=12)),
        (globex_node, {}),  # opened long ago: out of the 30 days
    ]
    for i, (node, times) in enumerate(rows):
        at = opened if i < 4 else opened - timedelta(days=40)
        Incident.objects.create(cluster_id=node.cluster_id, node=node, kind="gpu_xid", opened_at=at, **times)
    found = incident_medians(user=users["operator"], since=timezone.now() - timedelta(days=30))
    minutes = {k: v / 60 if v is not None else None for k, v in found["fleet"].items() if k != "incidents"}
    assert minutes == pytest.approx({"acknowledge": 5.0, "recover": 6.0, "resolve": 30.0})
    assert found["fleet"]["incidents"] == 4
    acme = next(row for row in found["clusters"] if row["id"] == world.acme_cluster.pk)
    assert (acme["acknowledge"], acme["resolve"], acme["recover"]) == (240.0, 1800.0, 240.0)

    client.force_login(users["operator"])
    home = client.get("/").content.decode()
    fleet_row = home.split('id="medians-fleet"')[1].split("</tr>")[0]
    assert ">5 min<" in fleet_row and ">6 min<" in fleet_row and ">30 min<" in fleet_row
    api.as_token(users["operator"], "read")
    metrics = api.get("/metrics").content.decode()
    assert 'lockstep_incident_median_seconds{measure="acknowledge"} 300.0' in metrics
    assert (
        f'lockstep_cluster_incident_median_seconds{{cluster="{world.acme_cluster.name}",measure="resolve"}} 1800.0'
        in metrics
    )
    assert 'lockstep_incidents{work_state="new"} 5.0' in metrics
