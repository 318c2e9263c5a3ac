"""Banners (issue 47, item 4): dry-run, paused and a tripped circuit breaker on every page of the scope they
govern, with who set them and when; a tenant sees only those over its own clusters and jobs, without another
tenant's details."""

import re
from dataclasses import dataclass
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleet.choices import AutomationMode
from fleet.models import Cluster, Fleet, Node
from fleet.services.automation import automation_switch_set
from fleet.services.clusters import cluster_update, fleet_update
from fleet.services.nodes import node_cordon
from jobs.models import Job
from tests.support.factories import make_cluster, make_fleet
from tests.support.jobs import bulk_nodes, node_of, submit

pytestmark = pytest.mark.django_db
STAMP = re.compile(r'<time datetime="\d{4}-\d\d-\d\dT[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>')


@dataclass
class World:
    fleet: Fleet
    acme: Cluster
    globex: Cluster
    shared: Cluster
    other: Cluster  # in another fleet
    jobs: dict[str, Job]


@pytest.fixture
def world(users, tenant_a, tenant_b):
    """One fleet holding acme's and globex's dedicated clusters and a shared one; a cluster of another fleet."""
    fleet = make_fleet("east", max_disrupted_percent=100)
    acme = make_cluster(fleet, "acme-dedicated", dedicated_tenant=tenant_a)
    globex = make_cluster(fleet, "globex-dedicated", dedicated_tenant=tenant_b)
    shared = make_cluster(fleet, "shared-east")
    other = make_cluster(make_fleet("west"), "west-1")
    for cluster in (acme, globex, shared, other):
        bulk_nodes(cluster, 2, prefix=cluster.name)
    jobs = {
        "acme": submit(acme, tenant_a, gpus=8, name="acme-own"),
        "globex": submit(globex, tenant_b, gpus=8, name="globex-own"),
        "acme-shared": submit(shared, tenant_a, gpus=8, name="acme-shared"),
        "other": submit(other, tenant_a, gpus=8, name="acme-west"),
    }
    return World(fleet, acme, globex, shared, other, jobs)


def page(client, user, url: str, status: int = 200) -> str:
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status, (url, response.status_code)
    return response.content.decode()


def banners(text: str) -> list[str]:
    """The text of each banner on the page, whitespace folded."""
    return [
        " ".join(unescape(re.sub(r"<[^>]+>", "", block)).split())
        for block in re.findall(
            r'<div class="banner banner-[^"]+" data-banner="[^"]+">(.*?)</div>', text, re.S
        )
    ]


def test_the_provider_switch_is_on_every_page_with_who_and_when(client, users, world):
    admin = users["provider-admin"]
    urls = ["/", reverse("fleet-clusters"), reverse("job-list"), reverse("audit-list")]
    for url in urls:
        assert banners(page(client, users["operator"], url)) == [], url
    automation_switch_set(actor=admin, mode=AutomationMode.PAUSED, reason="storage incident")
    for url in [*urls, reverse("fleet-cluster", args=[world.acme.pk])]:
        html = page(client, users["operator"], url)
        found = banners(html)
        assert len(found) == 1, (url, found)
        assert found[0].startswith("Automation paused everywhere"), found
        assert f"Set by {admin.username}" in found[0] and "Reason: storage incident" in found[0]
        assert STAMP.search(html.split('class="banners"')[1]), url
    automation_switch_set(actor=admin, mode=AutomationMode.DRY_RUN)
    assert 'data-banner="dry-run"' in page(client, users["operator"], "/")
    assert banners(page(client, users["operator"], "/"))[0].startswith("Automation in dry run everywhere")
    automation_switch_set(actor=admin, mode=AutomationMode.ACTIVE)
    assert banners(page(client, users["operator"], "/")) == []


def test_a_tenant_sees_the_provider_switch_but_not_who_threw_it_or_why(client, users, world):
    admin = users["provider-admin"]
    automation_switch_set(actor=admin, mode=AutomationMode.PAUSED, reason="acme's storage incident")
    for role in ("tenant-viewer", "other-admin"):
        html = page(client, users[role], "/")
        found = banners(html)
        assert len(found) == 1 and "Set by the provider" in found[0], found
        assert admin.username not in html.split('class="banners"')[1].split("</section>")[0]
        assert "storage incident" not in html


def test_a_cluster_mode_is_on_its_pages_its_nodes_and_its_jobs_only(client, users, world):
    operator = users["operator"]
    cluster_update(actor=operator, cluster=world.acme, automation=AutomationMode.PAUSED)
    governed = [
        reverse("fleet-cluster", args=[world.acme.pk]),
        reverse("fabric", args=[world.acme.pk]),
        reverse("node-detail", args=[node_of(world.jobs["acme"]).pk]),
        reverse("job-detail", args=[world.jobs["acme"].pk]),
    ]
    for url in governed:
        found = banners(page(client, users["provider-admin"], url))
        assert found == [found[0]] and found[0].startswith("Automation paused on cluster acme-dedicated"), url
        assert f"Set by {operator.username}" in found[0], found
    for url in (
        "/",
        reverse("fleet-cluster", args=[world.shared.pk]),
        reverse("job-detail", args=[world.jobs["acme-shared"].pk]),
    ):
        assert banners(page(client, users["provider-admin"], url)) == [], url
    # acme's own users see it on their cluster's pages, set by the provider; globex's users nowhere.
    found = banners(page(client, users["tenant-viewer"], reverse("job-detail", args=[world.jobs["acme"].pk])))
    assert len(found) == 1 and "Set by the provider" in found[0] and operator.username not in found[0]
    assert banners(page(client, users["other-admin"], "/")) == []
    assert (
        banners(page(client, users["other-admin"], reverse("job-detail", args=[world.jobs["globex"].pk])))
        == []
    )


def test_another_tenants_cluster_page_shows_no_banner_of_it(client, users, world):
    cluster_update(actor=users["operator"], cluster=world.acme, automation=AutomationMode.DRY_RUN)
    for url in (
        reverse("fleet-cluster", args=[world.acme.pk]),
        reverse("node-detail", args=[node_of(world.jobs["acme"]).pk]),
        reverse("job-detail", args=[world.jobs["acme"].pk]),
    ):
        html = page(client, users["other-admin"], url, status=404)
        assert banners(html) == [] and "acme-dedicated" not in html, url


def test_a_fleet_mode_is_on_the_pages_of_every_cluster_of_the_fleet(client, users, world):
    admin = users["provider-admin"]
    fleet_update(actor=admin, fleet=world.fleet, automation=AutomationMode.DRY_RUN)
    for cluster in (world.acme, world.globex, world.shared):
        found = banners(page(client, users["operator"], reverse("fleet-cluster", args=[cluster.pk])))
        assert len(found) == 1 and found[0].startswith("Automation in dry run on fleet east"), found
        assert f"Set by {admin.username}" in found[0]
    assert banners(page(client, users["operator"], reverse("fleet-cluster", args=[world.other.pk]))) == []
    # The fleet pages list every fleet's own holds.
    assert any(
        line.startswith("Automation in dry run on fleet east")
        for line in banners(page(client, admin, "/fleet/"))
    )
    # A tenant's job on the shared cluster is governed by the fleet too; the fleet is not named to it.
    found = banners(
        page(client, users["other-viewer"], reverse("job-detail", args=[world.jobs["globex"].pk]))
    )
    assert found and found[0].startswith("Automation in dry run on this cluster's fleet"), found
    assert "east" not in found[0] and admin.username not in found[0]


def test_a_mode_set_when_the_row_was_made_names_the_creation(client, users, world):
    from fleet.services.clusters import cluster_create

    created = cluster_create(
        actor=users["provider-admin"], fleet=world.fleet, name="born-paused", automation=AutomationMode.PAUSED
    )
    found = banners(page(client, users["operator"], reverse("fleet-cluster", args=[created.pk])))
    assert found and f"Set by {users['provider-admin'].username}" in found[0], found


def test_a_tripped_breaker_names_the_change_that_tripped_it(client, users, world):
    operator = users["operator"]
    Fleet.objects.filter(pk=world.fleet.pk).update(max_disrupted_percent=20)  # 6 nodes: one may be out
    tripping = Node.objects.filter(cluster=world.globex).order_by("hostname").first()
    cluster_page = reverse("fleet-cluster", args=[world.acme.pk])
    assert banners(page(client, operator, cluster_page)) == []
    node_cordon(actor=operator, node=tripping, reason="xid 79")
    html = page(client, operator, cluster_page)
    found = banners(html)
    assert len(found) == 1 and found[0].startswith("Circuit breaker tripped on fleet east"), found
    assert "1 of 6 nodes cordoned or draining" in found[0], found
    assert f"Tripped by {operator.username} (cordon of {tripping.hostname})" in found[0], found
    assert STAMP.search(html.split('class="banners"')[1])
    # Not on another fleet's pages, nor on pages of no cluster.
    assert banners(page(client, operator, reverse("fleet-cluster", args=[world.other.pk]))) == []
    assert banners(page(client, operator, "/")) == []
    # acme's users see it on their pages, without globex's node or the fleet's counts.
    for url in (cluster_page, reverse("job-detail", args=[world.jobs["acme-shared"].pk])):
        html = page(client, users["tenant-admin"], url)
        found = banners(html)
        assert len(found) == 1 and found[0].startswith("Circuit breaker tripped on this cluster's fleet"), (
            found
        )
        assert "Tripped by the provider" in found[0] and STAMP.search(html.split('class="banners"')[1])
        assert (
            tripping.hostname not in html and "of 6 nodes" not in html and operator.username not in found[0]
        )


def test_a_drain_cap_alone_holds_drains_only(client, users, world):
    Fleet.objects.filter(pk=world.fleet.pk).update(max_draining_nodes=0)
    found = banners(page(client, users["operator"], reverse("fleet-cluster", args=[world.shared.pk])))
    assert len(found) == 1 and "New drains are refused" in found[0], found
    assert "Tripped by the fleet's caps" in found[0], found


def test_banners_cost_a_fixed_few_queries(client, users, world):
    """The provider switch on every page (one query); the cluster holds on a cluster's pages, whatever the
    number of nodes or audit entries."""
    operator = users["operator"]
    client.force_login(operator)
    url = reverse("fleet-cluster", args=[world.acme.pk])
    cluster_update(actor=operator, cluster=world.acme, automation=AutomationMode.PAUSED)
    client.get(url)
    with CaptureQueriesContext(connection) as small:
        client.get(url)
    bulk_nodes(world.acme, 20)
    for mode in (AutomationMode.DRY_RUN, AutomationMode.PAUSED) * 5:
        cluster_update(actor=operator, cluster=world.acme, automation=mode)
    with CaptureQueriesContext(connection) as large:
        client.get(url)
    assert len(large.captured_queries) == len(small.captured_queries)


def test_selector_refuses_keys_that_are_no_numbers_and_unknown_kinds(users, world):
    from fleet.selectors_banners import governing_cluster

    assert governing_cluster(user=users["operator"], kind="job", pk="x") is None
    assert governing_cluster(user=users["operator"], kind="rack", pk=1) is None
    assert governing_cluster(user=users["operator"], kind="job", pk=10**30) is None
    assert (
        governing_cluster(user=users["operator"], kind="job", pk=world.jobs["globex"].pk) == world.globex.pk
    )
    assert governing_cluster(user=users["tenant-admin"], kind="job", pk=world.jobs["globex"].pk) is None
    assert (
        governing_cluster(user=users["tenant-admin"], kind="cluster", pk=world.shared.pk) == world.shared.pk
    )
    assert governing_cluster(user=users["tenant-admin"], kind="cluster", pk=world.globex.pk) is None


def test_an_incident_that_hit_a_tenants_job_on_a_shared_cluster_shows_that_clusters_hold(
    client, users, world
):
    from tests.support.incidents import make_action, make_incident

    incident = make_incident(node_of(world.jobs["acme-shared"]), reports=[{"kind": "nic_down"}])
    make_action(incident, world.jobs["acme-shared"], kind="nic_failover")
    cluster_update(actor=users["operator"], cluster=world.shared, automation=AutomationMode.PAUSED)
    url = reverse("incident-detail", args=[incident.pk])
    found = banners(page(client, users["tenant-viewer"], url))
    assert len(found) == 1 and found[0].startswith("Automation paused on cluster shared-east"), found
    assert "Set by the provider" in found[0]
    # globex's users do not see the incident, nor a banner of it.
    assert banners(page(client, users["other-viewer"], url, status=404)) == []
