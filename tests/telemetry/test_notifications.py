"""Notifications to a real HTTP receiver on loopback: delivered, retried, given up, never twice."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from controlplane import events
from telemetry.models import NotificationChannel, NotificationDelivery
from telemetry.services.channels import channel_create
from telemetry.services.notifications import MAX_ATTEMPTS, notifications_deliver, notifications_dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback_receivers_allowed(settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # the receivers here listen on 127.0.0.1


class Receiver:
    def __init__(self, status=200):
        self.status = status
        self.bodies = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(outer.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.close()


def failed_action():
    """Recovery gave up on job 7 (jobs.services.jobs.job_fail publishes this)."""
    events.publish(
        ["fleet"],
        "job.state",
        {
            "job": 7,
            "name": "llm-pretrain",
            "state": "Failed",
            "reason": "restart from checkpoint failed 4 times; last: no spare",
        },
    )


def test_failed_recovery_reaches_generic_and_slack_webhooks_once(users, receiver):
    admin = users["provider-admin"]
    channel_create(actor=admin, name="ops", url=receiver.url)
    channel_create(actor=admin, name="slack", url=receiver.url, kind="slack")
    events.publish(["fleet"], "tenant.created", {"name": "not interesting"})
    failed_action()
    assert notifications_dispatch() == 2
    assert notifications_dispatch() == 0  # the cursor moved: dispatching again writes nothing
    counts = notifications_deliver()
    assert counts["delivered"] == 2
    generic = next(b for b in receiver.bodies if "rule" in b)
    slack = next(b for b in receiver.bodies if "text" in b)
    assert (
        generic["rule"] == "job_failed" and generic["kind"] == "job.state" and generic["payload"]["job"] == 7
    )
    assert (
        "llm-pretrain (7) failed: restart from checkpoint failed 4 times" in slack["text"] and slack["blocks"]
    )
    assert notifications_deliver()["delivered"] == 0
    assert len(receiver.bodies) == 2


def test_a_failed_attempt_that_falls_back_is_not_announced_but_a_failed_ladder_step_is(users, receiver):
    channel_create(actor=users["provider-admin"], name="ops", url=receiver.url)
    events.publish(["fleet"], "action.failed", {"summary": "live migration failed", "job": 7, "node": 3})
    events.publish(["fleet"], "job.state", {"job": 7, "state": "Running"})
    assert notifications_dispatch() == 0  # the next attempt carries the recovery on
    events.publish(["fleet"], "action.failed", {"summary": "gpu reset failed", "job": None, "node": 3})
    assert notifications_dispatch() == 1
    notifications_deliver()
    assert receiver.bodies[0]["rule"] == "recovery_failed"


def test_failing_receiver_is_retried_with_backoff_then_given_up(users):
    down = Receiver(status=500)
    try:
        channel_create(actor=users["provider-admin"], name="flaky", url=down.url)
        failed_action()
        notifications_dispatch()
        now = timezone.now()
        assert notifications_deliver(now=now)["retry"] == 1
        delivery = NotificationDelivery.objects.get()
        assert delivery.attempts == 1 and delivery.last_status == 500 and delivery.next_attempt_at > now
        assert notifications_deliver(now=now)["retry"] == 0  # not due yet
        for _ in range(MAX_ATTEMPTS - 1):
            now += timedelta(hours=2)
            notifications_deliver(now=now)
        delivery.refresh_from_db()
        assert delivery.state == "failed" and delivery.attempts == MAX_ATTEMPTS
        assert len(down.bodies) == MAX_ATTEMPTS
    finally:
        down.close()


def test_unreachable_receiver_is_logged(users):
    channel_create(actor=users["provider-admin"], name="gone", url="http://127.0.0.1:9/hook")
    failed_action()
    notifications_dispatch()
    notifications_deliver()
    delivery = NotificationDelivery.objects.get()
    assert delivery.state == "pending" and "ConnectionError" in delivery.last_error


def test_channel_rules_filter_and_rollout_and_needs_human_notices(users, receiver):
    channel_create(
        actor=users["provider-admin"], name="rollouts-only", url=receiver.url, rules=["rollout_stopped"]
    )
    failed_action()
    events.publish(
        ["fleet"],
        "rollout.rolledback",
        {"rollout": 4, "state": "RolledBack", "reason": "failure budget spent"},
    )
    events.publish(
        ["fleet"], "node.escalation", {"node": 9, "hostname": "dgx-9", "stage": "failed", "needs_human": True}
    )
    assert notifications_dispatch() == 1
    assert NotificationDelivery.objects.get().rule == "rollout_stopped"
    channel_create(actor=users["provider-admin"], name="all", url=receiver.url)
    events.publish(
        ["fleet"], "node.escalation", {"node": 9, "hostname": "dgx-9", "stage": "failed", "needs_human": True}
    )
    assert notifications_dispatch() == 1
    assert NotificationDelivery.objects.filter(rule="needs_human").count() == 1


def test_channel_api_is_for_the_provider_admin(api, users, receiver):
    api.as_token(users["operator"])
    assert (
        api.post(
            "/api/v1/notification-channels/", {"name": "x", "url": receiver.url}, format="json"
        ).status_code
        == 403
    )
    api.as_token(users["provider-admin"])
    created = api.post(
        "/api/v1/notification-channels/",
        {"name": "x", "url": receiver.url, "kind": "slack", "rules": ["recovery_failed"]},
        format="json",
    )
    assert created.status_code == 201, created.content
    bad = api.post(
        "/api/v1/notification-channels/", {"name": "y", "url": "not a url", "rules": ["nope"]}, format="json"
    )
    assert bad.status_code == 400 and {"url", "rules"} <= set(bad.json())
    assert NotificationChannel.objects.count() == 1
    assert api.get("/api/v1/notification-deliveries/").status_code == 200


def test_pausing_automation_on_a_fleet_or_cluster_is_announced(users, receiver):
    from fleet.services.clusters import cluster_update, fleet_update
    from tests.support.factories import make_cluster, make_fleet

    admin = users["provider-admin"]
    channel_create(actor=admin, name="ops", url=receiver.url, rules=["automation_paused"])
    fleet = make_fleet(name="us-west")
    cluster = make_cluster(fleet, name="usw-1")
    fleet_update(actor=admin, fleet=fleet, description="renamed region")  # not about automation
    fleet_update(actor=admin, fleet=fleet, automation="paused")
    cluster_update(actor=admin, cluster=cluster, automation="paused")
    assert notifications_dispatch() == 2
    notifications_deliver()
    summaries = sorted(body["summary"] for body in receiver.bodies)
    assert summaries == ["Recovery automation paused on us-west", "Recovery automation paused on usw-1"]


# --- issue 54 (M): the SSRF guard bypassed with a backslash; the internal reply's body shown to operators ----------


@pytest.fixture
def internal():
    """A real HTTP server inside the installation (loopback, a port the kernel picks) that must hear nothing."""
    from tests.support.outbound import Receiver as Recording

    running = Recording(
        status=500, body=b"internal-secret: the reply of a service only the installation reaches"
    )
    yield running
    running.close()


def deliver_to(url: str) -> NotificationDelivery:
    """A channel row with ``url`` as it may be found in the database (saved before a check, or a name that resolves
    elsewhere since), one notice due to it, delivered once."""
    channel = NotificationChannel.objects.create(name="c", url=url)
    NotificationDelivery.objects.create(
        channel=channel, event_id=1, rule="job_failed", summary="s", next_attempt_at=timezone.now()
    )
    notifications_deliver()
    return NotificationDelivery.objects.get()


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://127.0.0.1:{port}\\@8.8.8.8/hook", "backslashes"),  # the report's URL
        ("http://u:p@127.0.0.1:{port}/hook", "user name or password"),
        ("http://2130706433:{port}/hook", "dotted-decimal"),  # 127.0.0.1 in decimal
        ("http://localhost:{port}/hook", "localhost is 127.0.0.1, which is a loopback address"),
    ],
)
def test_an_internal_target_is_refused_when_saved_and_when_sent(api, users, internal, settings, url, words):
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    url = url.format(port=internal.port)
    api.as_token(users["provider-admin"])
    answer = api.post("/api/v1/notification-channels/", {"name": "c", "url": url}, format="json")
    assert answer.status_code == 400 and words in str(answer.json()["url"]), answer.content
    assert not NotificationChannel.objects.exists()
    delivery = deliver_to(url)
    assert delivery.last_status is None and delivery.last_error.startswith("target refused: "), (
        delivery.last_error
    )
    assert words in delivery.last_error
    assert internal.seen == []


def test_a_name_that_resolves_to_loopback_is_refused_at_delivery(users, internal, settings):
    """The name is not looked up when it is saved (it may resolve elsewhere by the time it is used); it is when
    the notice is sent, and the address it resolves to then is checked and connected to."""
    settings.OUTBOUND_ALLOWED_NETWORKS = []
    NotificationChannel.objects.create(name="n", url="http://hooks.example/x")  # a name, saved while public
    delivery = deliver_to(f"http://localhost:{internal.port}/hook")
    assert "loopback" in delivery.last_error and internal.seen == []


def test_a_failed_delivery_keeps_the_status_not_the_body(api, users, internal, settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # the provider allows this receiver's range
    delivery = deliver_to(internal.url())
    assert len(internal.seen) == 1  # it was sent
    assert (delivery.state, delivery.last_status, delivery.last_error) == ("pending", 500, "HTTP 500")
    api.as_token(users["provider-admin"])
    listed = api.get("/api/v1/notification-deliveries/")
    assert listed.status_code == 200 and "internal-secret" not in listed.content.decode()
    assert '"last_status":500' in listed.content.decode().replace(" ", "")
