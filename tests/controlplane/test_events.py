import pytest
from django.db import OperationalError, connection, transaction

from controlplane import events
from controlplane.models import Event
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def test_publish_numbers_events_per_topic():
    events.publish(["fleet", "tenant-1"], "a.b", {"n": 1})
    events.publish(["fleet"], "a.b", {"n": 2})
    events.publish(["tenant-1", "fleet"], "a.b", {"n": 3})
    assert list(Event.objects.filter(topic="fleet").values_list("seq", flat=True)) == [1, 2, 3]
    assert list(Event.objects.filter(topic="tenant-1").values_list("seq", flat=True)) == [1, 2]


def test_rolled_back_transaction_leaves_no_event():
    with pytest.raises(RuntimeError), transaction.atomic():
        events.publish(["fleet"], "a.b")
        raise RuntimeError
    assert not Event.objects.exists()


@pytest.mark.parametrize(
    "name", ["nope", "nosuch-17", "tenant", "tenant-x", "fleet-3", "", "FLEET", "tenant-1-2"]
)
def test_unknown_or_malformed_topics_are_refused(name):
    with pytest.raises(events.UnknownTopic):
        events.publish([name], "a.b")


def test_group_names_come_from_the_registry():
    assert events.group_name("tenant-7") == "lockstep.tenant-7"
    assert events.topic("tenant", 7) == "tenant-7"
    with pytest.raises(events.UnknownTopic):
        events.topic("tenant")


def test_may_subscribe_follows_roles(users, tenant_a, tenant_b):
    a, b = f"tenant-{tenant_a.pk}", f"tenant-{tenant_b.pk}"
    expected = {
        "provider-admin": {"fleet": True, a: True, b: True},
        "operator": {"fleet": True, a: True, b: True},
        "tenant-admin": {"fleet": False, a: True, b: False},
        "tenant-viewer": {"fleet": False, a: True, b: False},
        "other-viewer": {"fleet": False, a: False, b: True},
    }
    for role, topics in expected.items():
        for name, allowed in topics.items():
            assert events.may_subscribe(users[role], name) is allowed, (role, name)
    from django.contrib.auth.models import AnonymousUser

    assert events.may_subscribe(AnonymousUser(), a) is False


def test_catch_up_endpoint_returns_what_was_missed_in_order(api, users, tenant_a):
    topic = f"tenant-{tenant_a.pk}"
    for n in range(5):
        events.publish([topic], "thing.happened", {"n": n})
    api.as_token(users["tenant-viewer"], "read")
    body = api.get("/api/v1/events/", {"topic": topic, "after": 2}).json()
    assert [row["seq"] for row in body["results"]] == [3, 4, 5]
    assert [row["payload"]["n"] for row in body["results"]] == [2, 3, 4]


def test_catch_up_refuses_other_tenants_and_bad_input(api, users, tenant_b):
    api.as_token(users["tenant-viewer"], "read")
    assert api.get("/api/v1/events/", {"topic": f"tenant-{tenant_b.pk}"}).status_code == 403
    assert api.get("/api/v1/events/", {"topic": "fleet"}).status_code == 403
    assert api.get("/api/v1/events/").status_code == 400
    assert api.get("/api/v1/events/", {"topic": "bogus-topic-x"}).status_code == 400
    assert (
        api.get(
            "/api/v1/events/",
            {"topic": f"tenant-{users['tenant-viewer'].membership.tenant_id}", "after": "x"},
        ).status_code
        == 400
    )
    api.as_token(users["operator"], "read")
    assert api.get("/api/v1/events/").status_code == 200


def test_outbox_sweep_sends_unsent_events_and_marks_them():
    events.publish(["fleet"], "x.y")
    assert Event.objects.filter(sent_at__isnull=True).count() == 1  # no commit in this test: relay never ran
    sent = events.outbox_sweep(min_age_seconds=0)
    assert sent == 1
    assert not Event.objects.filter(sent_at__isnull=True).exists()
    assert events.outbox_sweep(min_age_seconds=0) == 0


def test_a_relay_that_cannot_mark_its_events_sent_does_not_fail_its_caller():
    """The relay runs after COMMIT: a database gone away by then (PostgreSQL restarting) must not turn the request
    that stored a fault into an error, or its client retries a report that was stored."""
    (event,) = events.publish(["fleet"], "a.b", {"n": 1})

    def refuse_updates(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("UPDATE"):
            raise OperationalError("server closed the connection unexpectedly")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse_updates):
        assert events.relay([(event.pk, event.as_message())]) == 1
    event.refresh_from_db()
    assert event.sent_at is None  # unmarked: the sweep sends it again
    assert events.outbox_sweep(min_age_seconds=0) == 1
    event.refresh_from_db()
    assert event.sent_at is not None


def test_retention_prunes_old_events():
    from datetime import timedelta

    from django.utils import timezone

    events.publish(["fleet"], "old")
    events.publish(["fleet"], "new")
    Event.objects.filter(kind="old").update(created_at=timezone.now() - timedelta(days=30))
    assert events.events_prune(days=7) == 1
    assert list(Event.objects.values_list("kind", flat=True)) == ["new"]


def test_tenant_model_is_its_own_scope(users, tenant_a):
    from tenancy.scoping import restrict

    assert list(restrict(Tenant.objects.all(), users["tenant-viewer"])) == [tenant_a]
    assert restrict(Tenant.objects.all(), users["operator"]).count() == 2


def test_gathered_events_are_written_at_the_end_in_order_and_a_rolled_back_savepoint_loses_its_own():
    """Issue 26: a decision's events are written together at its end (one statement, one relay), in the order they
    were published; an event published inside a savepoint that rolls back goes with it."""
    with transaction.atomic():
        with events.gathered():
            events.publish(["fleet"], "first", {"n": 1})
            try:
                with transaction.atomic():
                    events.publish(["fleet", "cluster-7"], "undone", {"n": 2})
                    raise RuntimeError("the savepoint rolls back")
            except RuntimeError:
                pass
            with pytest.raises(events.UnknownTopic):
                events.publish(["no-such-topic-x"], "refused")  # refused where it is published
            events.publish_many([(["cluster-7"], "second", {"n": 3}, ""), (["fleet"], "third", {"n": 4}, "")])
            assert not Event.objects.exists()  # nothing written yet
        assert [e.kind for e in Event.objects.order_by("pk")] == ["first", "second", "third"]
        assert [(e.topic, e.seq) for e in Event.objects.order_by("pk")] == [
            ("fleet", 1),
            ("cluster-7", 1),
            ("fleet", 2),
        ]


def test_gathered_publishes_once_in_one_statement_and_nothing_after_an_error():
    from django.test.utils import CaptureQueriesContext

    with transaction.atomic():
        with CaptureQueriesContext(connection) as statements, events.gathered():
            for n in range(20):
                events.publish(["fleet", f"cluster-{n}"], "many", {"n": n})
        assert len(statements.captured_queries) == 1 and Event.objects.count() == 40
    with transaction.atomic():
        with pytest.raises(RuntimeError), events.gathered():
            events.publish(["fleet"], "lost")
            raise RuntimeError("the decision failed")
        events.publish(["fleet"], "after")  # outside the block: written at once again
    assert not Event.objects.filter(kind="lost").exists() and Event.objects.filter(kind="after").exists()
