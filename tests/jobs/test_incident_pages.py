"""The job page and the fault feed show incidents, each with its reports folded under it; scoped; bounded."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobs.models import FaultEvent
from tests.support.incidents import incident_world, make_action, make_incident
from tests.support.jobs import node_of, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tenant_a, tenant_b):
    return incident_world(tenant_a, tenant_b)


def block(page: str, tag: str, attribute: str, pk: int) -> str:
    """The element ``<tag attribute="pk">…</tag>`` of a page: a table row, or a feed row (whose own closing tag
    the template puts on a line of its own, after the rows folded in it)."""
    start = page.index(f'<{tag} {attribute}="{pk}"')
    return page[start : page.index("</tr>" if tag == "tr" else "\n    </li>", start)]


def test_job_page_shows_its_incidents_with_their_reports_and_attempts(client, users, world):
    client.force_login(users["tenant-viewer"])
    page = client.get(reverse("job-detail", args=[world.jobs["acme"].pk])).content.decode()
    incident = world.incidents["acme"]
    assert page.count("<tr data-incident=") == 1
    row = block(page, "tr", "data-incident", incident.pk)
    assert "<code>gpu_xid 79</code>" in row and node_of(world.jobs["acme"]).hostname in row
    assert '<td class="state">open</td>' in row
    assert (
        'reports: <span class="report-count">3</span> from <span class="report-sources">agent, alertmanager, api</span>'
        in row
    )
    # Its reports, folded in a <details> under it.
    details = row[row.index("<details") : row.index("</details>")]
    assert [int(pk) for pk in re.findall(r'data-fault="(\d+)"', details)] == list(
        incident.faults.order_by("detected_at").values_list("pk", flat=True)
    )
    assert "node_unreachable" in details and "×2" in details
    # This job's attempts, in order, with their states; not the second acme job's recovery of the same failure.
    attempts = [int(pk) for pk in re.findall(r'data-action="(\d+)"', row)]
    assert attempts == [world.actions["failed"].pk, world.actions["restart"].pk]
    assert 'live_migration <span class="state">failed</span>' in row and "no spare of this model" in row
    assert 'restart_from_checkpoint <span class="state">succeeded</span>' in row


def test_job_page_of_a_shared_incident_shows_only_the_readers_attempts(client, users, world):
    incident = world.incidents["shared-acme"]
    client.force_login(users["other-viewer"])
    page = client.get(reverse("job-detail", args=[world.jobs["globex-shared"].pk])).content.decode()
    assert {int(pk) for pk in re.findall(r'<tr data-incident="(\d+)"', page)} == {
        incident.pk,
        world.incidents["shared-globex"].pk,
    }
    row = block(page, "tr", "data-incident", incident.pk)
    assert re.findall(r'data-action="(\d+)"', row) == [str(world.actions["shared-acme-globex"].pk)]
    assert world.jobs["acme-shared"].name not in page
    # Another tenant's job page is not there at all; a job no incident hit says so.
    assert client.get(reverse("job-detail", args=[world.jobs["acme"].pk])).status_code == 404
    client.force_login(users["tenant-viewer"])
    second = client.get(reverse("job-detail", args=[world.jobs["acme-2"].pk])).content.decode()
    row = block(second, "tr", "data-incident", world.incidents["acme"].pk)  # its proactive move and dry run
    assert re.findall(r'data-action="(\d+)"', row) == [
        str(world.actions["expected"].pk),
        str(world.actions["dry-run"].pk),
    ]
    assert "(dry run)" in row
    client.force_login(users["operator"])
    idle = submit(world.shared, world.jobs["acme"].tenant, gpus=8)
    assert (
        "No incidents have hit this job."
        in client.get(reverse("job-detail", args=[idle.pk])).content.decode()
    )


def test_fault_feed_folds_reports_under_their_incident(client, users, world):
    client.force_login(users["operator"])
    page = client.get(reverse("fault-overview")).content.decode()
    feed = page[page.index('id="fault-feed"') : page.index("</ol>\n</section>")]
    incidents = world.incidents
    # One row per incident, newest activity first, and the fault of no incident as its own row, last (oldest).
    rows = re.findall(r'\n    <li data-(incident|fault)="(\d+)"', feed)
    assert rows == [
        ("incident", str(incidents[n].pk)) for n in ("idle", "shared-globex", "shared-acme", "globex", "acme")
    ] + [("fault", str(world.orphan.pk))]
    acme = block(feed, "li", "data-incident", incidents["acme"].pk)
    folded = [int(pk) for pk in re.findall(r'data-fault="(\d+)"', acme)]
    assert folded == list(incidents["acme"].faults.order_by("detected_at").values_list("pk", flat=True))
    assert "incident open" in acme and "agent, alertmanager, api" in acme
    assert "incident resolved" in block(feed, "li", "data-incident", incidents["idle"].pk)
    # Every report is shown exactly once: folded under its incident, or as its own row.
    shown = [int(pk) for pk in re.findall(r'data-fault="(\d+)"', feed)]
    assert sorted(shown) == sorted(FaultEvent.objects.values_list("pk", flat=True))


def test_fault_feed_of_a_tenant_holds_only_what_hit_its_jobs(client, users, world):
    client.force_login(users["tenant-viewer"])
    page = client.get(reverse("fault-overview")).content.decode()
    incidents = world.incidents
    shown = {int(pk) for pk in re.findall(r'<li data-incident="(\d+)"', page)}
    assert shown == {incidents["acme"].pk, incidents["shared-acme"].pk}
    assert f'<li data-fault="{world.orphan.pk}"' in page
    for name in ("globex", "shared-globex", "idle"):
        assert incidents[name].node.hostname not in page, name
    # One cluster's feed: the tenant's own cluster.
    own = client.get(reverse("fault-overview") + f"?cluster={world.acme_cluster.pk}").content.decode()
    assert {int(pk) for pk in re.findall(r'<li data-incident="(\d+)"', own)} == {incidents["acme"].pk}
    assert client.get(reverse("fault-overview") + f"?cluster={world.globex_cluster.pk}").status_code == 404


def test_pages_query_counts_do_not_grow_with_incidents(client, users, world):
    client.force_login(users["tenant-admin"])
    job_url = reverse("job-detail", args=[world.jobs["acme"].pk])
    client.get(job_url)
    client.get(reverse("fault-overview"))
    with CaptureQueriesContext(connection) as job_small:
        client.get(job_url)
    with CaptureQueriesContext(connection) as feed_small:
        client.get(reverse("fault-overview"))
    for _ in range(5):
        incident = make_incident(
            node_of(world.jobs["acme"]), reports=[{"kind": "thermal"}, {"kind": "straggler"}]
        )
        make_action(incident, world.jobs["acme"], fault=False, attempt=1)
    with CaptureQueriesContext(connection) as job_large:
        page = client.get(job_url).content.decode()
    with CaptureQueriesContext(connection) as feed_large:
        feed = client.get(reverse("fault-overview")).content.decode()
    assert page.count("<tr data-incident=") == 6 and feed.count("\n    <li data-incident=") == 7
    assert len(job_large.captured_queries) == len(job_small.captured_queries)
    assert len(feed_large.captured_queries) == len(feed_small.captured_queries)
