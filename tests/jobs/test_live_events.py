"""Every fault and action reaches job-, cluster-, tenant- and fleet topics; tenants never see each other's."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from controlplane.models import Event
from jobs.services.advance import recovery_advance
from jobs.services.faults import fault_handle, fault_ingest
from tests.support.factories import token_header
from tests.support.jobs import INSTANT, node_of, protected_cluster, submit

pytestmark = pytest.mark.django_db(transaction=True)


async def connect(user):
    header = await sync_to_async(token_header)(user, "read")
    communicator = WebsocketCommunicator(
        application, "/ws/events/", headers=[(b"authorization", header["HTTP_AUTHORIZATION"].encode())]
    )
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["type"] == "hello"
    return communicator


async def drain(communicator, timeout=1.5):
    found = []
    while not await communicator.receive_nothing(timeout=timeout):
        found.append(await communicator.receive_json_from(timeout=5))
    return found


@sync_to_async
def storm_on_both(tenant_a, tenant_b):
    dedicated_b = protected_cluster(nodes=2, spares=1, tenant=tenant_b, connection=INSTANT)
    shared = protected_cluster(nodes=4, spares=2, connection=INSTANT)
    job_a = submit(shared, tenant_a, gpus=8, name="a")
    job_b = submit(shared, tenant_b, gpus=8, name="b")
    job_b2 = submit(dedicated_b, tenant_b, gpus=8, name="b2")
    return shared, dedicated_b, job_a, job_b, job_b2


@sync_to_async
def fail(job):
    fault, _ = fault_ingest(source="agent", kind="node_unreachable", node=node_of(job))
    fault_handle(fault_id=fault.pk)
    recovery_advance()
    return fault


async def test_tenant_users_receive_only_their_own_jobs_events(users, tenant_a, tenant_b):
    shared, dedicated_b, job_a, job_b, job_b2 = await storm_on_both(tenant_a, tenant_b)
    viewer_a = await connect(users["tenant-viewer"])
    asked = [
        f"job-{job_a.pk}",
        f"job-{job_b.pk}",
        f"job-{job_b2.pk}",
        f"tenant-{tenant_a.pk}",
        f"tenant-{tenant_b.pk}",
        f"cluster-{shared.pk}",
        f"cluster-{dedicated_b.pk}",
        "fleet",
    ]
    await viewer_a.send_json_to({"subscribe": asked})
    reply = await viewer_a.receive_json_from(timeout=5)
    assert sorted(reply["topics"]) == sorted([f"job-{job_a.pk}", f"tenant-{tenant_a.pk}"])
    operator = await connect(users["operator"])
    await operator.send_json_to(
        {"subscribe": [f"job-{job_a.pk}", f"cluster-{shared.pk}", "fleet", f"tenant-{tenant_b.pk}"]}
    )
    await operator.receive_json_from(timeout=5)

    await fail(job_b)
    await fail(job_b2)
    fault_a = await fail(job_a)

    seen = await drain(viewer_a)
    assert seen, "tenant A's viewer got nothing"
    assert {m["topic"] for m in seen} <= {f"job-{job_a.pk}", f"tenant-{tenant_a.pk}"}
    for message in seen:
        for payload in [message["payload"], *message["payload"].get("actions", [])]:
            assert payload.get("job") in (None, job_a.pk), message
            assert payload.get("fault") in (None, fault_a.pk), message
    decided = [m for m in seen if m["kind"] == "actions.decided"]
    assert {m["topic"] for m in decided} == {f"tenant-{tenant_a.pk}", f"job-{job_a.pk}"}
    assert all([a["job"] for a in m["payload"]["actions"]] == [job_a.pk] for m in decided)
    kinds = {m["kind"] for m in seen if m["topic"] == f"job-{job_a.pk}"}
    assert {"fault.reported", "actions.decided", "actions.completed"} <= kinds
    decided_on_job = next(
        m for m in seen if m["kind"] == "actions.decided" and m["topic"] == f"job-{job_a.pk}"
    )
    [started] = decided_on_job["payload"]["actions"]
    assert started["event"] == "action.started" and started["fault_state"] == "handled"

    everything = await drain(operator)
    by_topic = {}
    for message in everything:
        by_topic.setdefault(message["topic"], set()).add(message["kind"])
    for name in ("fleet", f"cluster-{shared.pk}", f"tenant-{tenant_b.pk}"):
        assert {"fault.reported", "actions.decided", "actions.completed"} <= by_topic[name], name
    # And the outbox holds them for catch-up on every one of the four topics.
    shared_topics = await sync_to_async(
        lambda: set(
            Event.objects.filter(
                kind="actions.completed", payload__actions__contains=[{"job": job_a.pk}]
            ).values_list("topic", flat=True)
        )
    )()
    assert shared_topics == {f"job-{job_a.pk}", f"cluster-{shared.pk}", f"tenant-{tenant_a.pk}", "fleet"}
    await viewer_a.disconnect()
    await operator.disconnect()
