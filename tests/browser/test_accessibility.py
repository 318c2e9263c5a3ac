"""Accessibility: axe-core (bundled with axe-playwright-python) finds no serious or critical violation on the
main pages, for a provider and a tenant user."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.models import FaultEvent, Incident, Job, RecoveryAction
from simulator.world import world_build
from tests.support.browser import log_in, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"
User = get_user_model()


def violations(page) -> list[str]:
    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {len(v['nodes'])} node(s), e.g. {v['nodes'][0]['target']}"
        for v in results.response["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.fixture
def world():
    world_build(seed=12, nodes_per_cluster=16, spares=2)
    for name in ("lockstep-simulator", "nimbus-admin"):
        usable_password(User.objects.get(username=name), PASSWORD)


def test_login_page_is_accessible(page, server, db):
    page.goto(f"{server.url}/accounts/login/")
    assert violations(page) == []


def an_incident(job: Job) -> Incident:
    """An incident on the job's node with one report and the job's recovery of it (the detail pages' content)."""
    now = timezone.now()
    node = job.allocations.filter(released_at__isnull=True).first().node
    incident = Incident.objects.create(
        cluster_id=node.cluster_id,
        node=node,
        kind="nic_down",
        nic_name="mlx5_1",
        scope="nic",
        opened_at=now,
        last_reported_at=now,
    )
    fault = FaultEvent.objects.create(
        kind="nic_down",
        nic_name="mlx5_1",
        cluster_id=node.cluster_id,
        node=node,
        sources=["agent"],
        detected_at=now,
        received_at=now,
        correlation_key="accessibility",
        incident=incident,
    )
    RecoveryAction.objects.create(
        incident=incident,
        fault=fault,
        job=job,
        cluster_id=node.cluster_id,
        node=node,
        kind="nic_failover",
        state="succeeded",
        detected_at=now,
        ended_at=now,
        gpus=job.gpus,
        alternatives=[
            {
                "kind": "restart_from_checkpoint",
                "feasible": True,
                "gpu_hours_lost": 1.2,
                "pause_seconds": 600,
                "work_lost_seconds": 60,
                "why": "always possible",
            }
        ],
    )
    return incident


def test_provider_pages_are_accessible(page, server, world):
    log_in(page, server.url, "lockstep-simulator", PASSWORD)
    job = Job.objects.filter(allocations__released_at__isnull=True).first()
    incident = an_incident(job)
    found = {}
    for path in [
        "/",
        "/jobs/",
        f"/jobs/{job.pk}/",
        "/faults/",
        "/whatif/",
        "/scenarios/",
        "/tokens/",
        "/audit/",
        "/clusters/",
        "/fabric/",
        f"/nodes/{incident.node_id}/",
        f"/incidents/{incident.pk}/",
        f"/search/?q={incident.node.hostname[:6]}",
    ]:
        page.goto(f"{server.url}{path}")
        page.wait_for_load_state("networkidle")
        problems = violations(page)
        if problems:
            found[path] = problems
    assert found == {}


def test_tenant_home_is_accessible(page, server, world):
    log_in(page, server.url, "nimbus-admin", PASSWORD)
    page.wait_for_load_state("networkidle")
    assert violations(page) == []


def test_tenant_detail_pages_and_search_are_accessible(page, server, world):
    job = Job.objects.filter(
        tenant__slug="nimbus", cluster__dedicated_tenant__slug="nimbus", allocations__released_at__isnull=True
    ).first()
    incident = an_incident(job)
    log_in(page, server.url, "nimbus-admin", PASSWORD)
    found = {}
    for path in [
        "/clusters/",
        f"/nodes/{incident.node_id}/",
        f"/incidents/{incident.pk}/",
        f"/search/?q={job.name}",
    ]:
        page.goto(f"{server.url}{path}")
        page.wait_for_load_state("networkidle")
        problems = violations(page)
        if problems:
            found[path] = problems
    assert found == {}
