"""GPU-hours lost beside saved (issue 47): the provider home (today, 30 days, and a cumulative line beside saved),
the tenant home (its own jobs only, per job too) and the job page, each counting what every total counts: the
succeeded recoveries that are not dry runs (docs/gpu-hours.md). A proactive move's cost is lost whether or not
its expected saving is settled; its expected saving stays apart from the realized one."""

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import ActionState, SavingState
from jobs.models import RecoveryAction
from tests.support.jobs import protected_cluster, submit

pytestmark = pytest.mark.django_db


def book(job, *, saved=0.0, lost=0.0, state=ActionState.SUCCEEDED, ago=timedelta(0), **fields):
    ended = timezone.now() - ago
    return RecoveryAction.objects.create(
        job=job,
        cluster=job.cluster,
        kind=fields.pop("kind", "live_migration"),
        state=state,
        detected_at=ended - timedelta(seconds=30),
        started_at=ended - timedelta(seconds=20),
        ended_at=ended,
        gpus=job.gpus,
        gpu_hours_saved=saved,
        gpu_hours_lost=lost,
        gpu_hours_baseline=saved + lost,
        **fields,
    )


@pytest.fixture
def ledger(tenant_a, tenant_b):
    """Acme's job: 40 saved and 4.00 lost booked (a migration, a restart, an unsettled proactive move), a dry run
    and a failed attempt that count for nothing. Globex's job: 10 saved and 1.50 lost today, 1 and 2 forty days
    ago."""
    acme = submit(protected_cluster(nodes=4, spares=1, tenant=tenant_a, name="acme-c"), tenant_a, gpus=8)
    globex = submit(protected_cluster(nodes=4, spares=1, tenant=tenant_b, name="globex-c"), tenant_b, gpus=8)
    book(acme, saved=40.0, lost=0.5)
    book(acme, saved=0.0, lost=3.25, kind="restart_from_checkpoint")
    book(acme, lost=0.25, kind="proactive_migration", saving=SavingState.EXPECTED, gpu_hours_expected=5.0)
    book(acme, saved=99.0, lost=100.0, dry_run=True)
    book(acme, lost=7.0, state=ActionState.FAILED)
    book(globex, saved=10.0, lost=1.5)
    book(globex, saved=1.0, lost=2.0, ago=timedelta(days=40))
    return {"acme": acme, "globex": globex}


def figure(html: str, element_id: str) -> str:
    return re.search(rf'id="{element_id}"[^>]*>([^<]+)<', html).group(1)


def script_data(html: str, element_id: str) -> dict:
    start = html.index(f'<script id="{element_id}" type="application/json">')
    start = html.index(">", start) + 1
    return json.loads(html[start : html.index("</script>", start)])


def test_provider_home_shows_lost_beside_saved(client, users, ledger):
    client.force_login(users["operator"])
    html = client.get("/", {"range": "7d"}).content.decode()
    assert figure(html, "fig-saved-today") == "50.00" and figure(html, "fig-lost-today") == "5.50"
    assert figure(html, "fig-saved-30d") == "50.00" and figure(html, "fig-lost-30d") == "5.50"
    assert figure(html, "fig-expected") == "5.00 more expected"
    charts = script_data(html, "dashboard-data")["charts"]
    assert charts["saved"][-1]["v"] == 50.0 and charts["lost"][-1]["v"] == 5.5
    assert [p["t"] for p in charts["saved"]] == [p["t"] for p in charts["lost"]]
    assert "GPU-hours saved and lost" in html
    summary = re.search(r'id="saved-summary">([^<]+)<', html).group(1)
    assert summary.startswith("Saved: 50.00 GPU-hours in all") and "Lost: 5.50 GPU-hours in all" in summary
    # the 30-day chart leaves out Globex's booking of forty days ago
    charts = script_data(client.get("/", {"range": "30d"}).content.decode(), "dashboard-data")["charts"]
    assert charts["lost"][-1]["v"] == 5.5


def test_tenant_home_shows_its_own_lost_only(client, users, ledger):
    client.force_login(users["tenant-viewer"])  # Acme
    html = client.get("/").content.decode()
    assert figure(html, "fig-saved") == "40.00" and figure(html, "fig-lost") == "4.00"
    row = re.search(rf"<tr data-job=\"{ledger['acme'].pk}\">.*?</tr>", html, re.S).group(0)
    assert 'class="saved" data-value="40.0"' in row and re.search(r'class="lost"[^>]*>4.00<', row)
    assert f'data-job="{ledger["globex"].pk}"' not in html

    client.force_login(users["other-viewer"])  # Globex: all its bookings, the old one included
    html = client.get("/").content.decode()
    assert figure(html, "fig-saved") == "11.00" and figure(html, "fig-lost") == "3.50"
    assert f'data-job="{ledger["acme"].pk}"' not in html


def test_job_page_shows_lost_beside_saved_to_its_own_tenant(client, users, ledger):
    job = ledger["acme"]
    client.force_login(users["tenant-viewer"])
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert figure(html, "gpu-hours-saved") == "40.00" and figure(html, "gpu-hours-lost") == "4.00"
    timeline = script_data(html, "timeline-data")
    assert timeline["gpu_hours_saved"] == 40.0 and timeline["gpu_hours_lost"] == 4.0
    table = html[html.index('id="action-table"') : html.index("</table>", html.index('id="action-table"'))]
    assert '<th scope="col">GPU-h lost</th>' in table and '<td class="lost">3.25</td>' in table

    client.force_login(users["other-viewer"])
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    html = client.get(f"/jobs/{ledger['globex'].pk}/").content.decode()
    assert figure(html, "gpu-hours-lost") == "3.50"
