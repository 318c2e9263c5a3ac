"""POST /api/v1/incidents/{id}/acknowledge/, assign/, notes/, resolve/, reopen/: incidents worked as on-call work,
audited, published live and to the notifications; a tenant reaches only the incidents it sees (another's is
404), a viewer only reads (403), bad input is a 400 and a step the incident's state refuses a 409."""

import pytest

from controlplane.models import AuditEntry, Event
from telemetry.models import NotificationChannel, NotificationDelivery
from telemetry.services.notifications import notifications_dispatch
from tests.support.incidents import incident_world, make_action

pytestmark = pytest.mark.django_db

ACTIONS = ("acknowledge", "assign", "notes", "resolve", "reopen")
BODIES = {"assign": {"user": None}, "notes": {"body": "looking"}, "resolve": {"cause": "hardware"}}


@pytest.fixture
def world(tenant_a, tenant_b):
    return incident_world(tenant_a, tenant_b)


def url(incident, action: str) -> str:
    return f"/api/v1/incidents/{incident.pk}/{action}/"


def test_an_operator_works_an_incident_through_every_step(api, users, world):
    NotificationChannel.objects.create(
        name="on-call", url="https://hooks.example.org/x", rules=["incident_worked"]
    )
    incident = world.incidents["acme"]
    api.as_token(users["operator"])
    answer = api.post(url(incident, "acknowledge"))
    assert answer.status_code == 200, answer.content
    work = answer.json()
    assert work["work_state"] == "acknowledged" and work["acknowledged_by"] == users["operator"].username
    assert work["times"]["acknowledge"] >= 3600 - 5  # the incident was opened an hour ago
    again = api.post(url(incident, "acknowledge"))
    assert again.status_code == 409 and "already acknowledged" in again.json()["detail"]

    answer = api.post(url(incident, "assign"), {"user": users["tenant-admin"].pk}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["assignee"] == users["tenant-admin"].pk
    answer = api.post(
        url(incident, "notes"), {"body": "Swapped **GPU 3**; <script>x</script>"}, format="json"
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["by_provider"] is True

    answer = api.post(url(incident, "resolve"), {"cause": "hardware"}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["work_state"] == "resolved" and answer.json()["cause"] == "hardware"
    assert answer.json()["times"]["resolve"] >= answer.json()["times"]["acknowledge"]
    twice = api.post(url(incident, "resolve"), {"cause": "fabric"}, format="json")
    assert twice.status_code == 409 and "already resolved" in twice.json()["detail"]
    assert api.post(url(incident, "acknowledge")).status_code == 409

    answer = api.post(url(incident, "reopen"))
    assert answer.status_code == 200 and answer.json()["work_state"] == "acknowledged"
    assert answer.json()["cause"] == "" and answer.json()["closed_at"] is None
    assert api.post(url(incident, "reopen")).status_code == 409
    assert api.get(url(incident, "work")).json()["work_state"] == "acknowledged"

    steps = [
        "incident.acknowledge",
        "incident.assign",
        "incident.note",
        "incident.resolve",
        "incident.reopen",
    ]
    entries = AuditEntry.objects.filter(object_type="jobs.incident", object_id=str(incident.pk))
    assert sorted(entries.values_list("action", flat=True)) == sorted(steps)
    kinds = [
        "incident.acknowledged",
        "incident.assigned",
        "incident.noted",
        "incident.resolved",
        "incident.reopened",
    ]
    fleet = Event.objects.filter(topic="fleet", kind__startswith="incident.").order_by("seq")
    assert list(fleet.values_list("kind", flat=True)) == kinds
    tenant_topic = f"tenant-{world.jobs['acme'].tenant_id}"
    assert Event.objects.filter(topic=tenant_topic, kind="incident.resolved").exists()
    assert notifications_dispatch() == len(kinds)
    assert "resolved by" in NotificationDelivery.objects.get(payload__kind="incident.resolved").summary


def test_bad_input_is_a_400_naming_the_field(api, users, world):
    incident = world.incidents["acme"]
    api.as_token(users["provider-admin"])
    cases = [
        ("resolve", {"cause": "gremlins"}, "cause"),
        ("resolve", {}, "cause"),
        ("assign", {}, "user"),
        ("assign", {"user": "somebody"}, "user"),
        ("assign", {"user": 999999}, "user"),
        ("assign", {"user": 10**30}, "user"),
        # globex's admin may not see acme's incident: not someone it may go to
        ("assign", {"user": users["other-admin"].pk}, "user"),
        ("notes", {}, "body"),
        ("notes", {"body": "   "}, "body"),
        ("notes", {"body": "x" * 10_001}, "body"),
        ("notes", {"body": ["a", "list"]}, "body"),
    ]
    for action, body, field in cases:
        answer = api.post(url(incident, action), body, format="json")
        assert answer.status_code == 400, (action, body, answer.status_code, answer.content)
        assert field in answer.json(), (action, body, answer.json())
    assert api.post(url(incident, "notes"), "[1]", content_type="application/json").status_code == 400
    assert not AuditEntry.objects.filter(action__startswith="incident.").exists()


def test_another_tenants_incident_is_a_404_and_a_viewer_may_only_read(api, users, world):
    acme, globex = world.incidents["acme"], world.incidents["globex"]
    for role, incident in (("tenant-admin", globex), ("tenant-viewer", globex), ("other-admin", acme)):
        api.as_token(users[role])
        for action in ACTIONS:
            answer = api.post(url(incident, action), BODIES.get(action, {}), format="json")
            assert answer.status_code == 404, (role, action, answer.status_code)
        assert api.get(url(incident, "notes")).status_code == 404
        assert api.get(url(incident, "work")).status_code == 404
    api.as_token(users["tenant-viewer"])
    assert api.get(url(acme, "work")).status_code == 200
    for action in ACTIONS:
        answer = api.post(url(acme, action), BODIES.get(action, {}), format="json")
        assert answer.status_code == 403, (action, answer.status_code)
    # A tenant admin annotates its own incidents; the rest of the work is the provider's.
    api.as_token(users["tenant-admin"])
    assert api.post(url(acme, "notes"), {"body": "our job restarted fine"}, format="json").status_code == 201
    for action in ("acknowledge", "assign", "resolve", "reopen"):
        assert api.post(url(acme, action), BODIES.get(action, {}), format="json").status_code == 403, action
    assert (
        not AuditEntry.objects.filter(action__startswith="incident.").exclude(action="incident.note").exists()
    )


def test_a_tenants_note_is_its_own_and_the_providers(api, users, world):
    """The NIC incident on the shared cluster hit acme's and globex's jobs: both tenants see it, each reads only
    its own notes and the provider's."""
    shared = world.incidents["shared-acme"]
    api.as_token(users["tenant-admin"])
    assert api.post(url(shared, "notes"), {"body": "acme: secret"}, format="json").status_code == 201
    api.as_token(users["other-admin"])
    assert api.post(url(shared, "notes"), {"body": "globex: private"}, format="json").status_code == 201
    api.as_token(users["operator"])
    assert api.post(url(shared, "notes"), {"body": "NIC replaced"}, format="json").status_code == 201
    assert [n["body"] for n in api.get(url(shared, "notes")).json()] == [
        "acme: secret",
        "globex: private",
        "NIC replaced",
    ]
    api.as_token(users["tenant-viewer"])
    assert [n["body"] for n in api.get(url(shared, "notes")).json()] == ["acme: secret", "NIC replaced"]
    api.as_token(users["other-viewer"])
    assert [n["body"] for n in api.get(url(shared, "notes")).json()] == ["globex: private", "NIC replaced"]
    # globex's note went to the fleet and to globex, not to acme's topic.
    noted = Event.objects.filter(kind="incident.noted")
    assert set(noted.filter(payload__by=users["other-admin"].username).values_list("topic", flat=True)) == {
        "fleet",
        f"tenant-{world.jobs['globex'].tenant_id}",
    }


def test_resolving_waits_for_a_running_recovery(api, users, world):
    incident = world.incidents["globex"]
    running = make_action(incident, world.jobs["globex"], state="running", fault=False)
    api.as_token(users["operator"])
    answer = api.post(url(incident, "resolve"), {"cause": "software"}, format="json")
    assert answer.status_code == 409 and "still running" in answer.json()["detail"]
    running.state = "succeeded"
    running.save(update_fields=["state"])
    assert api.post(url(incident, "resolve"), {"cause": "software"}, format="json").status_code == 200
