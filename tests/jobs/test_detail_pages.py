"""Detail pages, links and search: the clusters list, the node page, the incident page, the links between them and
the job and fault pages, the fault feed's pages and the header's search; each as the provider and as each tenant
role, allowed and refused (another tenant's object is a 404, like a missing one), bad input a 4xx."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet.models import Node
from jobs.models import FaultEvent, JobAllocation, NodeEscalation
from jobs.services.escalation import escalation_repaired
from tests.support.incidents import incident_world, make_action, make_incident
from tests.support.jobs import node_of, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(tenant_a, tenant_b):
    return incident_world(tenant_a, tenant_b)


def get(client, user, url):
    client.force_login(user)
    return client.get(url)


def page_of(client, user, url) -> str:
    response = get(client, user, url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def links(page: str) -> set[str]:
    return set(re.findall(r'href="([^"?#]+)', page))


# --- the clusters list ---------------------------------------------------------------------------------------------


def test_clusters_list_shows_what_the_reader_sees_in_full_with_their_fabric(client, users, world):
    page = page_of(client, users["operator"], reverse("fleet-clusters"))
    for cluster in (world.acme_cluster, world.globex_cluster, world.shared):
        assert (
            reverse("fleet-cluster", args=[cluster.pk]) in page
            and reverse("fabric", args=[cluster.pk]) in page
        )
    # The navigation leads to it and to the fabric pages; /fleet/ still answers.
    assert f'href="{reverse("fleet-clusters")}" aria-current="page"' in page
    assert f'href="{reverse("fabric-index")}"' in page
    assert get(client, users["operator"], reverse("fleet-overview")).status_code == 200

    for role in ("tenant-admin", "tenant-viewer"):
        page = page_of(client, users[role], reverse("fleet-clusters"))
        assert reverse("fleet-cluster", args=[world.acme_cluster.pk]) in page
        for cluster in (world.globex_cluster, world.shared):
            assert reverse("fleet-cluster", args=[cluster.pk]) not in page and cluster.name not in page
    fabric = page_of(client, users["other-viewer"], reverse("fabric-index"))
    assert reverse("fabric", args=[world.globex_cluster.pk]) in fabric
    assert world.acme_cluster.name not in fabric and world.shared.name not in fabric


def test_cluster_page_links_its_fabric_faults_and_nodes(client, users, world):
    page = page_of(client, users["tenant-viewer"], reverse("fleet-cluster", args=[world.acme_cluster.pk]))
    assert reverse("fabric", args=[world.acme_cluster.pk]) in page
    assert f"{reverse('fault-overview')}?cluster={world.acme_cluster.pk}" in page
    for node in world.acme_cluster.nodes.all():
        assert reverse("node-detail", args=[node.pk]) in page


def test_clusters_list_takes_a_bad_page_and_refuses_anonymous_readers(client, users, world):
    # As every table page (django-tables2): a page that is not there shows the last one there is.
    for bad in ("99", "abc", "-1"):
        page = page_of(client, users["operator"], reverse("fleet-clusters") + f"?page={bad}")
        assert reverse("fleet-cluster", args=[world.shared.pk]) in page, bad
    client.logout()
    assert client.get(reverse("fleet-clusters")).status_code == 302


# --- the node page -------------------------------------------------------------------------------------------------


def test_node_page_shows_hardware_faults_jobs_and_ladder(client, users, world):
    job = world.jobs["acme"]
    node = node_of(job)
    # A past placement on the node: a second acme job that moved away from it.
    moved = world.jobs["acme-2"]
    JobAllocation.objects.filter(job=moved).update(node=node, released_at=timezone.now())
    # The ladder: the node failed and was repaired (the service records the step and publishes it).
    NodeEscalation.objects.create(node=node, stage="failed", reason="uncorrectable ECC")
    escalation_repaired(actor=users["operator"], node=node, reason="replaced GPU 3")

    for role in ("operator", "tenant-admin", "tenant-viewer"):
        page = page_of(client, users[role], reverse("node-detail", args=[node.pk]))
        assert page.count("<tr data-gpu=") == 8 and page.count("<tr data-nic=") == 8
        assert 'id="ladder-stage">Repaired' in page and "replaced GPU 3" in page
        history = page[page.index('id="ladder-history"') :]
        assert '<td class="stage">repaired</td>' in history[: history.index("</table>")]
        current = re.findall(r'<tr data-job="(\d+)" class="current"', page)
        past = re.findall(r'<tr data-job="(\d+)" class="past"', page)
        assert current == [str(job.pk)] and past == [str(moved.pk)]
        faults = {int(pk) for pk in re.findall(r'<tr data-fault="(\d+)"', page)}
        assert faults == set(FaultEvent.objects.filter(node=node).values_list("pk", flat=True))
        assert world.orphan.pk in faults
        # Each fault links to its incident and to the job its recovery was for; the page to its cluster.
        assert {
            reverse("incident-detail", args=[world.incidents["acme"].pk]),
            reverse("job-detail", args=[job.pk]),
            reverse("fleet-cluster", args=[node.cluster_id]),
            reverse("fabric", args=[node.cluster_id]),
        } <= links(page)


def test_node_page_of_another_tenant_or_a_shared_cluster_is_a_404(client, users, world):
    globex_node = node_of(world.jobs["globex"])
    shared_node = node_of(world.jobs["acme-shared"])
    for role in ("tenant-admin", "tenant-viewer"):
        assert get(client, users[role], reverse("node-detail", args=[globex_node.pk])).status_code == 404
        # Acme's job runs there, but the cluster is shared: tenants see its nodes in no page (node_list).
        assert get(client, users[role], reverse("node-detail", args=[shared_node.pk])).status_code == 404
    for role in ("provider-admin", "operator"):
        assert get(client, users[role], reverse("node-detail", args=[shared_node.pk])).status_code == 200
    missing = Node.objects.order_by("-pk").first().pk + 1000
    assert get(client, users["operator"], reverse("node-detail", args=[missing])).status_code == 404
    assert get(client, users["operator"], "/nodes/99999999999999999999999/").status_code == 404
    assert get(client, users["operator"], "/nodes/abc/").status_code == 404
    client.logout()
    assert client.get(reverse("node-detail", args=[globex_node.pk])).status_code == 302


def test_node_page_of_a_tenant_lists_only_its_own_jobs(client, users, world, tenant_b):
    node = node_of(world.jobs["acme"])
    # A globex job placed on acme's node (a provider could): acme's users never see it, the provider does.
    intruder = submit(world.globex_cluster, tenant_b, gpus=8, name="globex-intruder")
    JobAllocation.objects.filter(job=intruder).update(node=node)
    page = page_of(client, users["tenant-viewer"], reverse("node-detail", args=[node.pk]))
    assert "globex-intruder" not in page and reverse("job-detail", args=[intruder.pk]) not in page
    assert "globex-intruder" in page_of(client, users["operator"], reverse("node-detail", args=[node.pk]))


# --- the incident page ---------------------------------------------------------------------------------------------


def test_incident_page_shows_reports_recoveries_alternatives_and_ledger(client, users, world):
    incident = world.incidents["acme"]
    restart = world.actions["restart"]
    restart.alternatives = [
        {
            "kind": "live_migration",
            "feasible": False,
            "gpu_hours_lost": 0.4,
            "pause_seconds": 30,
            "work_lost_seconds": 0,
            "why": "tried for this recovery, and it failed",
        },
        {
            "kind": "restart_from_checkpoint",
            "feasible": True,
            "gpu_hours_lost": 2.0,
            "pause_seconds": 600,
            "work_lost_seconds": 300,
            "why": "always possible",
        },
    ]
    restart.save(update_fields=["alternatives"])
    for role in ("provider-admin", "tenant-admin", "tenant-viewer"):
        page = page_of(client, users[role], reverse("incident-detail", args=[incident.pk]))
        assert [int(pk) for pk in re.findall(r'<tr data-fault="(\d+)"', page)] == list(
            incident.faults.order_by("detected_at", "id").values_list("pk", flat=True)
        )
        actions = [int(pk) for pk in re.findall(r'<tr data-action="(\d+)"', page)]
        assert actions == [world.actions[n].pk for n in ("failed", "restart", "expected", "dry-run")]
        weighed = page[page.index(f'data-alternatives-of="{restart.pk}"') :]
        weighed = weighed[: weighed.index("</table>")]
        assert "live_migration" in weighed and "tried for this recovery, and it failed" in weighed
        assert "restart_from_checkpoint <strong>· chosen</strong>" in weighed
        # The ledger as docs/gpu-hours.md books it: succeeded, not dry runs; the proactive move's saving apart.
        assert 'id="ledger-saved">8.00<' in page and 'id="ledger-expected">4.00 GPU-h' in page
        assert 'id="ledger-baseline">16.00 GPU-h' in page and 'id="ledger-lost">2.50 GPU-h' in page
        assert 'id="ledger-jobs">2<' in page
        assert "expected 4.00 GPU-h" in page and "(dry run)" in page
        node = incident.node
        assert {
            reverse("node-detail", args=[node.pk]),
            reverse("fleet-cluster", args=[incident.cluster_id]),
            reverse("job-detail", args=[world.jobs["acme"].pk]),
            reverse("job-detail", args=[world.jobs["acme-2"].pk]),
        } <= links(page)


def test_incident_page_of_a_shared_incident_shows_only_the_readers_recoveries(client, users, world):
    incident = world.incidents["shared-acme"]
    page = page_of(client, users["other-viewer"], reverse("incident-detail", args=[incident.pk]))
    assert re.findall(r'<tr data-action="(\d+)"', page) == [str(world.actions["shared-acme-globex"].pk)]
    assert world.jobs["acme-shared"].name not in page
    assert 'id="ledger-saved">6.00<' in page and 'id="ledger-jobs">1<' in page
    # The node is on a shared cluster: named, not linked (its page would be a 404 for the tenant).
    assert incident.node.hostname in page and reverse("node-detail", args=[incident.node_id]) not in page
    assert reverse("fleet-cluster", args=[incident.cluster_id]) not in page
    provider = page_of(client, users["operator"], reverse("incident-detail", args=[incident.pk]))
    assert (
        len(re.findall(r'<tr data-action="(\d+)"', provider)) == 2 and 'id="ledger-saved">7.50<' in provider
    )


def test_incident_page_refuses_what_the_reader_may_not_see(client, users, world):
    for role in ("tenant-admin", "tenant-viewer"):
        for name in ("globex", "shared-globex", "idle"):
            assert (
                get(
                    client, users[role], reverse("incident-detail", args=[world.incidents[name].pk])
                ).status_code
                == 404
            )
    for role in ("other-admin", "other-viewer"):
        assert (
            get(
                client, users[role], reverse("incident-detail", args=[world.incidents["acme"].pk])
            ).status_code
            == 404
        )
    for role in ("provider-admin", "operator"):
        assert (
            get(
                client, users[role], reverse("incident-detail", args=[world.incidents["idle"].pk])
            ).status_code
            == 200
        )
    assert get(client, users["operator"], "/incidents/99999999999999999999999/").status_code == 404
    assert get(client, users["operator"], "/incidents/0/").status_code == 404


def test_a_stay_decision_is_shown_on_the_tenants_own_cluster_only(client, users, world):
    decision = {
        "chosen": "stay_degraded",
        "baseline": 3.5,
        "options": [
            {
                "kind": "stay_degraded",
                "feasible": True,
                "gpu_hours_lost": 0.25,
                "pause_seconds": 0,
                "work_lost_seconds": 0,
                "why": "keep running on the degraded link",
            },
            {
                "kind": "live_migration",
                "feasible": True,
                "gpu_hours_lost": 0.9,
                "pause_seconds": 40,
                "work_lost_seconds": 0,
                "why": "a spare node",
            },
        ],
    }
    for name in ("acme", "shared-acme"):
        fault = world.incidents[name].faults.order_by("pk").first()
        fault.details = {"decision": decision}
        fault.save(update_fields=["details"])
    own = page_of(
        client, users["tenant-viewer"], reverse("incident-detail", args=[world.incidents["acme"].pk])
    )
    assert (
        "Decided to stay: <strong>stay_degraded</strong>" in own
        and "keep running on the degraded link" in own
    )
    shared = reverse("incident-detail", args=[world.incidents["shared-acme"].pk])
    assert "Decided to stay" not in page_of(client, users["tenant-viewer"], shared)
    assert "Decided to stay: <strong>stay_degraded</strong>" in page_of(client, users["operator"], shared)


# --- links from the job page and the fault feed ---------------------------------------------------------------------


def test_job_page_lists_its_nodes_current_and_past(client, users, world):
    job = world.jobs["acme"]
    before = list(JobAllocation.objects.filter(job=job).values_list("node_id", flat=True))
    spare = Node.objects.filter(cluster=world.acme_cluster, state="spare").first()
    JobAllocation.objects.filter(job=job).update(released_at=timezone.now() - timedelta(minutes=1))
    JobAllocation.objects.create(job=job, node=spare, gpu_indices=list(range(8)), rank_start=0, rank_end=7)
    page = page_of(client, users["tenant-viewer"], reverse("job-detail", args=[job.pk]))
    block = page[page.index('id="job-nodes"') : page.index("</section>", page.index('id="job-nodes"'))]
    assert re.findall(r'<tr data-node="(\d+)" class="current"', block) == [str(spare.pk)]
    assert re.findall(r'<tr data-node="(\d+)" class="past"', block) == [str(pk) for pk in before]
    assert reverse("node-detail", args=[spare.pk]) in block and spare.hostname in block
    # The incidents table links each incident and its node; the facts link the cluster.
    incident = world.incidents["acme"]
    assert {
        reverse("incident-detail", args=[incident.pk]),
        reverse("node-detail", args=[incident.node_id]),
        reverse("fleet-cluster", args=[world.acme_cluster.pk]),
    } <= links(page)


def test_job_page_on_a_shared_cluster_names_its_nodes_without_links(client, users, world):
    job = world.jobs["acme-shared"]
    page = page_of(client, users["tenant-viewer"], reverse("job-detail", args=[job.pk]))
    node = node_of(job)
    block = page[page.index('id="job-nodes"') : page.index("</section>", page.index('id="job-nodes"'))]
    assert node.hostname in block and reverse("node-detail", args=[node.pk]) not in page
    assert reverse("fleet-cluster", args=[world.shared.pk]) not in page
    operator = page_of(client, users["operator"], reverse("job-detail", args=[job.pk]))
    assert (
        reverse("node-detail", args=[node.pk]) in operator
        and reverse("fleet-cluster", args=[world.shared.pk]) in operator
    )


def test_fault_feed_rows_link_to_incident_node_and_job(client, users, world):
    page = page_of(client, users["tenant-viewer"], reverse("fault-overview"))
    acme, shared = world.incidents["acme"], world.incidents["shared-acme"]
    row = page[page.index(f'<li data-incident="{acme.pk}"') :]
    row = row[: row.index("\n    </li>")]
    assert f'href="{reverse("incident-detail", args=[acme.pk])}"' in row
    assert f'href="{reverse("node-detail", args=[acme.node_id])}"' in row
    row = page[page.index(f'<li data-incident="{shared.pk}"') :]
    row = row[: row.index("\n    </li>")]
    assert f'href="{reverse("incident-detail", args=[shared.pk])}"' in row
    assert shared.node.hostname in row and reverse("node-detail", args=[shared.node_id]) not in row
    orphan = page[page.index(f'<li data-fault="{world.orphan.pk}"') :]
    orphan = orphan[: orphan.index("</li>")]
    assert f'href="{reverse("job-detail", args=[world.jobs["acme"].pk])}"' in orphan
    assert f'href="{reverse("node-detail", args=[world.orphan.node_id])}"' in orphan


def test_fault_feed_is_paged_and_keeps_its_cluster(client, users, world):
    node = node_of(world.jobs["acme"])
    start = timezone.now() - timedelta(days=1)
    made = [
        make_incident(node, at=start + timedelta(minutes=i), reports=[{"kind": "thermal"}]) for i in range(55)
    ]
    client.force_login(users["operator"])
    first = client.get(reverse("fault-overview")).content.decode()
    total = 55 + len(world.incidents) + 1  # and the orphan fault
    shown = re.findall(r'\n    <li data-(incident|fault)="(\d+)"', first)
    assert len(shown) == 50 and "Page 1 of 2" in first and 'data-page="1"' in first
    assert 'href="?page=2" rel="next"' in first
    second = client.get(reverse("fault-overview") + "?page=2").content.decode()
    rest = re.findall(r'\n    <li data-(incident|fault)="(\d+)"', second)
    assert len(rest) == total - 50 and not set(rest) & set(shown) and 'rel="prev"' in second
    assert rest[-1] == ("incident", str(made[0].pk))  # the oldest, last
    one = client.get(reverse("fault-overview") + f"?cluster={world.acme_cluster.pk}").content.decode()
    assert f'href="?cluster={world.acme_cluster.pk}&amp;page=2"' in one
    for bad in ("3", "0", "abc", "-1", "99999999999999999999"):
        assert client.get(reverse("fault-overview") + f"?page={bad}").status_code == 404, bad


# --- search ----------------------------------------------------------------------------------------------------


def results(page: str, kind: str) -> set[int]:
    return {int(pk) for pk in re.findall(rf'<li data-{kind}="(\d+)"', page)}


def test_search_finds_clusters_nodes_jobs_and_incidents_each_linking_to_its_page(client, users, world):
    client.force_login(users["operator"])
    search = reverse("search")
    page = client.get(search, {"q": world.acme_cluster.name}).content.decode()
    assert world.acme_cluster.pk in results(page, "cluster")
    assert reverse("fleet-cluster", args=[world.acme_cluster.pk]) in page
    node = node_of(world.jobs["acme"])
    page = client.get(search, {"q": node.hostname}).content.decode()
    assert results(page, "node") == {node.pk} and reverse("node-detail", args=[node.pk]) in page
    assert world.incidents["acme"].pk in results(page, "incident")  # by its node's hostname
    page = client.get(search, {"q": "acme-sec"}).content.decode()
    assert (
        results(page, "job") == {world.jobs["acme-2"].pk}
        and reverse("job-detail", args=[world.jobs["acme-2"].pk]) in page
    )
    incident = world.incidents["globex"]
    for q in (str(incident.pk), f"#{incident.pk}", f"incident {incident.pk}"):
        page = client.get(search, {"q": q}).content.decode()
        assert (
            incident.pk in results(page, "incident")
            and reverse("incident-detail", args=[incident.pk]) in page
        ), q
    page = client.get(search, {"q": "ecc_uncorr"}).content.decode()
    assert results(page, "incident") == {incident.pk}
    assert 'value="ecc_uncorr"' in page  # the header's box keeps the query


def test_search_as_a_tenant_finds_only_its_own(client, users, world):
    search = reverse("search")
    for role in ("tenant-admin", "tenant-viewer"):
        client.force_login(users[role])
        for q in (
            world.globex_cluster.name,
            node_of(world.jobs["globex"]).hostname,
            "globex",
            "ecc_uncorr",
            world.incidents["idle"].node.hostname,
        ):
            page = client.get(search, {"q": q}).content.decode()
            assert "Nothing you can see matches" in page, (role, q)
        page = client.get(search, {"q": "acme"}).content.decode()
        assert results(page, "job") == {world.jobs[n].pk for n in ("acme", "acme-2", "acme-shared")}
        # An incident that hit acme's job on the shared cluster is acme's to find; its node is not.
        shared_node = world.incidents["shared-acme"].node
        page = client.get(search, {"q": shared_node.hostname}).content.decode()
        assert results(page, "incident") == {world.incidents["shared-acme"].pk} and not results(page, "node")
        page = client.get(search, {"q": world.acme_cluster.name}).content.decode()
        assert results(page, "cluster") == {world.acme_cluster.pk}
        assert set(results(page, "node")) == set(world.acme_cluster.nodes.values_list("pk", flat=True))
    client.force_login(users["other-viewer"])
    page = client.get(search, {"q": "acme"}).content.decode()
    assert "Nothing you can see matches" in page and "acme-own" not in page


def test_search_refuses_bad_queries_and_shows_the_form_for_none(client, users, world):
    client.force_login(users["tenant-viewer"])
    search = reverse("search")
    assert client.get(search, {"q": "x" * 101}).status_code == 400
    assert client.get(search, {"q": "bad\x00byte"}).status_code == 400
    for q in ("", "   "):
        response = client.get(search, {"q": q})
        assert response.status_code == 200 and 'id="search-summary"' not in response.content.decode()
    for q in ("%", "_", "'; DROP TABLE jobs_job; --", "ü" * 100, "#", "incident"):
        assert client.get(search, {"q": q}).status_code == 200, q
    client.logout()
    assert client.get(search, {"q": "acme"}).status_code == 302


def test_search_and_detail_pages_query_counts_do_not_grow(client, users, world):
    client.force_login(users["tenant-admin"])
    node = node_of(world.jobs["acme"])
    urls = [
        reverse("search") + "?q=acme",
        reverse("node-detail", args=[node.pk]),
        reverse("incident-detail", args=[world.incidents["acme"].pk]),
        reverse("fleet-clusters"),
        reverse("job-detail", args=[world.jobs["acme"].pk]),
    ]
    for url in urls:
        client.get(url)
    small = {}
    for url in urls:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        small[url] = len(queries.captured_queries)
    for _ in range(6):
        incident = make_incident(node, kind="thermal", reports=[{"kind": "thermal"}, {"kind": "straggler"}])
        make_action(world.incidents["acme"], world.jobs["acme"], kind="restart_from_checkpoint", fault=False)
        make_action(incident, world.jobs["acme"], fault=False)
    for url in urls:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        assert len(queries.captured_queries) == small[url], url


def test_search_shows_at_most_twenty_of_a_kind_and_says_there_are_more(client, users, world):
    from tests.support.jobs import bulk_nodes

    bulk_nodes(world.shared, 25, prefix="many")
    client.force_login(users["operator"])
    page = client.get(reverse("search"), {"q": "many-"}).content.decode()
    assert len(results(page, "node")) == 20 and "More nodes match: narrow the search." in page
    page = client.get(reverse("search"), {"q": "many-002"}).content.decode()
    assert len(results(page, "node")) == 5 and "More nodes match" not in page
