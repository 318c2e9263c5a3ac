"""The fault feed in a real browser: an incident is a row with its reports folded under it, and a new report of
it that arrives live (its event names the incident) is folded under that row, which moves to the top; a report
of no incident the feed shows is a line of its own, as before."""

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from controlplane import events
from fleet.models import Node
from jobs.models import FaultEvent, Incident
from jobs.services.publishing import fault_payload
from simulator.world import world_build
from tests.support.browser import log_in, usable_password

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "correct-horse-9"


def report(node: Node, incident: Incident | None, kind: str, source: str) -> FaultEvent:
    now = timezone.now()
    return FaultEvent.objects.create(
        kind=kind,
        cluster_id=node.cluster_id,
        node=node,
        sources=[source],
        detected_at=now,
        received_at=now,
        correlation_key=f"browser-{kind}-{node.pk}",
        incident=incident,
    )


def publish_reported(fault: FaultEvent) -> None:
    """``fault.reported`` on the fleet topic, from a thread without the browser's event loop (so the real relay
    sends it), naming the fault's incident."""
    from django.db import connection, transaction

    def work():
        try:
            with transaction.atomic():
                events.publish(
                    ["fleet"],
                    "fault.reported",
                    {**fault_payload(fault), "incident": fault.incident_id},
                    url=f"/api/v1/faults/{fault.pk}/",
                )
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def test_a_new_report_of_an_incident_is_folded_under_it_live(page, server):
    world_build(seed=11, nodes_per_cluster=8, spares=2)
    admin = get_user_model().objects.get(username="lockstep-simulator")
    usable_password(admin, PASSWORD)
    first, second = Node.objects.order_by("pk")[:2]
    now = timezone.now()
    incident = Incident.objects.create(
        cluster_id=first.cluster_id, node=first, kind="gpu_xid", xid=79, opened_at=now, last_reported_at=now
    )
    report(first, incident, "gpu_xid", "agent")
    older = Incident.objects.create(
        cluster_id=second.cluster_id,
        node=second,
        kind="thermal",
        opened_at=now,
        last_reported_at=now + timedelta(seconds=1),
    )
    report(second, older, "thermal", "predictor")

    log_in(page, server.url, admin.username, PASSWORD)
    page.goto(f"{server.url}/faults/")
    page.wait_for_selector("#live-state[data-state='live']", timeout=10_000)
    total = int(page.locator("#total-faults").inner_text())
    row = page.locator(f'#fault-feed > li[data-incident="{incident.pk}"]')
    assert row.locator(".report-count").inner_text() == "1"
    assert page.locator("#fault-feed > li").first.get_attribute("data-incident") == str(older.pk)

    later = report(first, incident, "node_unreachable", "alertmanager")
    publish_reported(later)
    row.locator(f'.incident-faults li[data-fault="{later.pk}"]').wait_for(state="attached", timeout=5_000)
    assert row.locator(".report-count").inner_text() == "2"
    assert row.locator(".report-sources").inner_text() == "agent, alertmanager"
    assert page.locator("#fault-feed > li").first.get_attribute("data-incident") == str(incident.pk)
    assert page.locator("#fault-feed > li").count() == 2

    alone = report(second, None, "link_flap", "agent")
    publish_reported(alone)
    page.locator("#fault-feed > li", has_text="link_flap").first.wait_for(timeout=5_000)
    assert page.locator("#fault-feed > li").count() == 3
    assert int(page.locator("#total-faults").inner_text()) == total + 2
