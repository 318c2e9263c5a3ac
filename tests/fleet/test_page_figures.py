"""Fleet pages' figures read right (issue 23): batches from 1, a rolled-back rollout says so, drift resolved by a
rollout is not "Went away by itself", desired green and drifted red, a child version's effective contents."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from fleet.models import DriftFinding
from fleet.services.blueprints import version_create
from fleet.services.rollout_steps import rollout_step
from fleet.services.rollouts import rollout_rollback
from tests.support.blueprints import ADDONS, bump

pytestmark = pytest.mark.django_db


def _cells(html: str, table_id: str) -> list[list[str]]:
    body = html[html.index(f'id="{table_id}"') :]
    body = body[: body.index("</table>")]
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, flags=re.S)
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        for row in rows
    ]


def test_batches_are_numbered_from_one(client, users, world):  # noqa: F811
    rollout_step(rollout_id=world["rollout"].pk)  # first batch applied
    client.force_login(users["operator"])
    html = client.get(f"/rollouts/{world['rollout'].pk}/").content.decode()
    batches = [row for row in _cells(html, "rollout-batches") if row]
    assert [row[0].split(" ")[0] for row in batches] == [str(i) for i in range(1, len(batches) + 1)]
    clusters = [row for row in _cells(html, "rollout-clusters") if row]
    assert {row[1] for row in clusters} <= {str(i) for i in range(1, len(batches) + 1)} and "0" not in {
        r[1] for r in clusters
    }
    assert re.search(r"<dt>Batch in flight</dt><dd>1 of \d+</dd>", html)
    listing = client.get("/rollouts/").content.decode()
    cells = re.findall(r"<td[^>]*>(.*?)</td>", listing[listing.index("<tbody") :], flags=re.S)
    assert cells[3] == "Running" and cells[4] == "1"  # the batch in flight, counted from 1


def test_a_rolled_back_rollout_does_not_read_as_done(client, users, world):  # noqa: F811
    rollout_step(rollout_id=world["rollout"].pk)
    rollout_rollback(actor=users["operator"], rollout=world["rollout"], reason="bad canary")
    client.force_login(users["operator"])
    html = client.get(f"/rollouts/{world['rollout'].pk}/").content.decode()
    assert "outcome-bad" in html and "outcome-ok" not in html
    assert re.search(r"rolled back: \d+ of \d+ clusters? returned to their previous version", html)
    assert "Clusters done" not in html
    assert 'class="row-Succeeded"' not in html  # no green row for a cluster that was put back


def test_drift_resolved_by_a_rollout_says_so(client, users, world):  # noqa: F811
    cluster = world["shared"][0]
    finding = DriftFinding.objects.get(cluster=cluster, resolved_at__isnull=True)
    rollout_step(rollout_id=world["rollout"].pk)  # the rollout applies v2 to its first batch
    entry = world["rollout"].clusters.get(cluster=cluster)
    entry.applied_at = finding.detected_at + (timezone.now() - finding.detected_at) / 2
    entry.save(update_fields=["applied_at"])
    DriftFinding.objects.filter(pk=finding.pk).update(
        resolved_at=timezone.now(), resolution=DriftFinding.Resolution.CONVERGED
    )
    other = DriftFinding.objects.create(
        cluster=world["mine"],
        addon="network-operator",
        kind=finding.kind,
        detected_at=timezone.now(),
        last_seen_at=timezone.now(),
        resolved_at=timezone.now(),
        resolution=DriftFinding.Resolution.CONVERGED,
    )
    client.force_login(users["operator"])
    html = client.get(f"/clusters/{cluster.pk}/").content.decode()
    assert f"Fixed by rollout #{world['rollout'].pk}" in html and "Went away by itself" not in html
    listing = client.get("/drift/").content.decode()
    assert f"Fixed by rollout #{world['rollout'].pk}" in listing
    assert "Went away by itself" in client.get(f"/clusters/{other.cluster_id}/").content.decode()


def test_desired_values_are_green_and_drifted_values_red():
    css = (Path(settings.BASE_DIR) / "static" / "css" / "fleet.css").read_text()
    assert re.search(r"\.diff \.desired \{ color: var\(--ok\); \}", css)
    assert re.search(r"\.diff \.observed \{ color: var\(--bad\); \}", css)


def test_a_blueprint_diff_does_not_use_the_drift_colours(client, users, world):  # noqa: F811
    client.force_login(users["operator"])
    html = client.get(f"/blueprints/{world['bp'].pk}/?from=1&to=2").content.decode()
    assert 'class="before"' in html and 'class="after"' in html and 'class="desired"' not in html


def test_a_child_version_shows_its_effective_addons_and_node_software(client, users, world):  # noqa: F811
    actor = users["operator"]
    base = version_create(
        actor=actor, blueprint=world["bp"], addons=ADDONS, node_software={"cuda": "12.4", "gpu_driver": "550"}
    )
    child = version_create(
        actor=actor,
        blueprint=world["bp"],
        addons=[a for a in bump(ADDONS, "gpu-operator", "25.3.0") if a["name"] == "gpu-operator"],
        node_software={"cuda": "12.6"},
        parent=base.number,
    )
    client.force_login(actor)
    html = client.get(f"/blueprints/{world['bp'].pk}/").content.decode()
    row = html[html.index(f"<tr><td>v{child.number}</td>") :]
    row = row[: row.index("</tr>")]
    assert "gpu-operator 25.3.0" in row and "network-operator 24.7.0" in row and "nic-failover 1.2.0" in row
    assert "cuda 12.6" in row and "gpu_driver 550" in row and "cuda 12.4" not in row
    assert re.search(r'class="own"[^>]*>gpu-operator 25.3.0', row)
    assert re.search(r'class="inherited"[^>]*>network-operator 24.7.0', row)


def test_reconcile_does_not_claim_a_correction_the_page_does_not_show(client, users, world):  # noqa: F811
    cluster = world["shared"][0]
    client.force_login(users["operator"])
    html = client.post(f"/clusters/{cluster.pk}/reconcile/", follow=True).content.decode()
    assert DriftFinding.objects.filter(cluster=cluster, resolved_at__isnull=True).exists()
    assert "corrected" not in html.split('class="messages"')[1].split("</ul>")[0].lower()
    assert "re-applied gpu-operator" in html


def test_the_node_table_headers_read_as_words(client, users, world):  # noqa: F811
    client.force_login(users["operator"])
    html = client.get(f"/clusters/{world['mine'].pk}/").content.decode()
    assert ">GPUs<" in html and "Gpus" not in html and "Gpu model" not in html


def test_fleet_live_feeds_open_with_their_history(client, users, tenant_a, world):  # noqa: F811
    """The fleet pages' Live panel renders the topic's last events on load, newest first, written as the live
    ones are (name · state · reason); a tenant's own cluster page shows its own cluster's, nothing else."""
    from django.db import transaction

    from controlplane import events

    mine = world["mine"]
    with transaction.atomic():
        events.publish(
            ["fleet"], "cluster.status", {"name": "old-cluster", "status": "Degraded", "reason": "drift"}
        )
        events.publish([f"cluster-{mine.pk}"], "node.cordoned", {"name": "node-x", "state": "cordoned"})
        events.publish([f"cluster-{mine.pk}"], "node.uncordoned", {"name": "node-x", "state": "ready"})

    def feed(html: str) -> str:
        start = html.index('id="fleet-feed"')
        return html[start : html.index("</ol>", start)]

    client.force_login(users["operator"])
    overview = feed(client.get("/fleet/").content.decode())
    assert "old-cluster · Degraded · drift" in overview and 'class="empty"' not in overview
    assert re.search(
        r'<li data-seq="\d+"><time datetime="[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>', overview
    )
    page = feed(client.get(f"/clusters/{mine.pk}/").content.decode())
    assert page.index("node.uncordoned") < page.index("node.cordoned")  # newest first
    assert "old-cluster" not in page
    client.force_login(users["tenant-viewer"])
    page = feed(client.get(f"/clusters/{mine.pk}/").content.decode())
    assert "node-x · ready" in page and "old-cluster" not in page
