import pytest

from jobs.models import FaultEvent
from telemetry.models import AlertRecord
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/alertmanager/"


def alert(status="firing", fingerprint="f1", starts="2026-11-30T05:00:00Z", **labels):
    base = {"alertname": "GPUXidError", "Hostname": "dgx-7", "gpu": "2", "UUID": "GPU-abc"}
    base.update(labels)
    return {
        "status": status,
        "labels": base,
        "annotations": {"value": "79", "summary": "Xid 79 on dgx-7"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T05:10:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


def webhook(*alerts, status="firing"):
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GPUXidError"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "lockstep",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


@pytest.fixture
def node():
    return make_node(make_cluster(), "dgx-7")


def test_dcgm_xid_alert_opens_one_fault_and_dedupes(api, users, node):
    api.as_token(users["operator"])
    first = api.post(URL, webhook(alert()), format="json")
    assert first.status_code == 200, first.content
    assert first.json()["alerts"][0]["outcome"] == "opened"
    fault = FaultEvent.objects.get()
    assert (fault.kind, fault.xid, fault.gpu_index, fault.sources) == ("gpu_xid", 79, 2, ["alertmanager"])
    again = api.post(URL, webhook(alert()), format="json")
    assert again.json()["alerts"][0]["outcome"] == "duplicate"
    assert FaultEvent.objects.count() == 1


def test_resolved_alert_closes_what_its_firing_opened(api, users, node):
    api.as_token(users["operator"])
    api.post(URL, webhook(alert()), format="json")
    resolved = api.post(URL, webhook(alert(status="resolved"), status="resolved"), format="json")
    assert resolved.json()["alerts"][0]["outcome"] == "resolved"
    record = AlertRecord.objects.get()
    assert record.status == "resolved" and record.resolved_at is not None
    assert "alert_resolved_at" in FaultEvent.objects.get().details


def test_same_fault_from_agent_and_alertmanager_is_one_fault_event(api, users, node):
    from jobs.services.faults import fault_ingest

    fault_ingest(source="agent", kind="gpu_xid", node=node, gpu_index=2, xid=79)
    api.as_token(users["operator"])
    response = api.post(URL, webhook(alert()), format="json")
    assert response.json()["alerts"][0]["outcome"] == "merged"
    fault = FaultEvent.objects.get()
    assert sorted(fault.sources) == ["agent", "alertmanager"]


@pytest.mark.parametrize(
    "labels, kind",
    [
        ({"alertname": "GPUHighTemperature"}, "thermal"),
        ({"alertname": "DCGMDoubleBitECC"}, "ecc_uncorrectable"),
        ({"alertname": "NodeNotReady", "Hostname": "", "node": "dgx-7"}, "node_unreachable"),
        ({"alertname": "InfinibandLinkDown", "device": "mlx5_3"}, "nic_down"),
        ({"alertname": "Whatever", "lockstep_kind": "nvlink_error"}, "nvlink_error"),
    ],
)
def test_alert_kinds(api, users, node, labels, kind):
    api.as_token(users["operator"])
    response = api.post(URL, webhook(alert(**labels)), format="json")
    assert response.json()["alerts"][0]["outcome"] == "opened", response.json()
    assert FaultEvent.objects.get().kind == kind


def test_unplaceable_alerts_are_skipped_not_refused(api, users, node):
    api.as_token(users["operator"])
    body = webhook(
        alert(fingerprint="a", Hostname="ghost"),
        alert(fingerprint="b", alertname="DiskFull"),
        alert(fingerprint="c"),
    )
    outcomes = [a["outcome"] for a in api.post(URL, body, format="json").json()["alerts"]]
    assert outcomes == ["skipped", "skipped", "opened"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"version": "3", "alerts": []}, "version"),
        ({"version": "4", "alerts": "x"}, "alerts"),
        ({"version": "4"}, "alerts"),
        ([], "detail"),
    ],
)
def test_bad_payloads_are_400(api, users, node, body, field):
    api.as_token(users["operator"])
    response = api.post(URL, body, format="json")
    assert response.status_code == 400 and field in response.json()


@pytest.mark.parametrize(
    "role, status", [("tenant-admin", 403), ("tenant-viewer", 403), ("provider-admin", 200)]
)
def test_only_provider_roles_may_post(api, users, node, role, status):
    api.as_token(users[role])
    assert api.post(URL, webhook(alert()), format="json").status_code == status


def test_a_grouped_webhook_takes_its_new_alerts_in_together_with_the_outcomes_one_by_one_gives(api, users):
    """Issue 26: 64 nodes down arrive as one group; its new alerts are stored together (a few statements, not a dozen
    an alert), and a group that one alert spoils (the same alert twice, an unknown node) still gets each outcome."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = make_cluster()
    for i in range(6):
        make_node(cluster, f"dgx-{i}")
    api.as_token(users["operator"])

    def down(i, fingerprint=None):
        return alert(
            fingerprint=fingerprint or f"down-{i}", alertname="NodeDown", Hostname=f"dgx-{i}", gpu=""
        )

    with CaptureQueriesContext(connection) as four:
        together = api.post(URL, webhook(*(down(i) for i in range(4)), down(9)), format="json").json()[
            "alerts"
        ]
    assert [a["outcome"] for a in together] == ["opened"] * 4 + ["skipped"]
    assert len({a["fault"] for a in together[:4]}) == 4
    assert FaultEvent.objects.filter(kind="node_unreachable").count() == 4
    assert AlertRecord.objects.count() == 4
    assert len(four.captured_queries) < 40  # one by one it was about 15 an alert
    spoiled = api.post(URL, webhook(down(4), down(4), down(5), down(0)), format="json").json()["alerts"]
    assert [a["outcome"] for a in spoiled] == ["opened", "duplicate", "opened", "duplicate"]
    assert spoiled[0]["fault"] == spoiled[1]["fault"] and spoiled[3]["fault"] == together[0]["fault"]
    assert FaultEvent.objects.count() == 6 and AlertRecord.objects.count() == 6


def test_an_out_of_range_xid_skips_its_alert_and_the_group_is_taken_in(api, users, node, caplog):
    """Issue 54 (M): a DCGM_XID alert with "xid": "-5" answered 500 after the alerts before it were committed and
    before the ones after it were taken in, and Alertmanager retried the group forever."""
    api.as_token(users["operator"])
    group = webhook(
        alert(fingerprint="good-1"),
        alert(fingerprint="bad-xid", alertname="DCGM_XID", xid="-5", gpu="3"),
        alert(fingerprint="good-2", gpu="4"),
    )
    answer = api.post(URL, group, format="json")
    assert answer.status_code == 200, answer.content
    outcomes = answer.json()["alerts"]
    assert [item["outcome"] for item in outcomes] == ["opened", "skipped", "opened"], outcomes
    assert outcomes[1]["fingerprint"] == "bad-xid" and "xid '-5' is not an Xid code" in outcomes[1]["reason"]
    assert set(AlertRecord.objects.values_list("fingerprint", flat=True)) == {"good-1", "good-2"}
    assert sorted(FaultEvent.objects.values_list("gpu_index", "xid")) == [(2, 79), (4, 79)]
    assert "'bad-xid' skipped: xid '-5'" in caplog.text  # what the operator sees besides the answer
    again = api.post(URL, group, format="json")  # Alertmanager's retry changes nothing
    assert again.status_code == 200
    assert [item["outcome"] for item in again.json()["alerts"]] == ["duplicate", "skipped", "duplicate"]


@pytest.mark.parametrize(
    "labels, annotations, reason",
    [
        ({"xid": "70000"}, None, "not an Xid code"),
        ({"xid": "79.5"}, None, "not an Xid code"),
        ({"xid": "-0.5"}, None, "not an Xid code"),
        ({}, {"value": "1e12"}, "not an Xid code"),
        ({"lockstep_kind": "meteor"}, None, "unknown fault kind"),
        ({"Hostname": "h" * 101}, None, "over 100 characters"),
        ({"k" * 257: "v"}, None, "name over 256 characters"),
        ({f"l{i}": "v" for i in range(201)}, None, "more than 200 entries"),
        ({"summary": "x" * 4097}, None, "over 4096 characters"),
    ],
)
def test_every_field_is_bounded_before_anything_is_written(api, users, node, labels, annotations, reason):
    api.as_token(users["operator"])
    bad = alert(fingerprint="bad", **labels)
    if annotations:
        bad["annotations"] = annotations
    answer = api.post(URL, webhook(bad, alert(fingerprint="good")), format="json")
    assert answer.status_code == 200, answer.content
    skipped, good = answer.json()["alerts"]
    assert skipped["outcome"] == "skipped" and reason in skipped["reason"], skipped
    assert good["outcome"] == "opened"
    assert list(AlertRecord.objects.values_list("fingerprint", flat=True)) == ["good"]


@pytest.mark.parametrize("starts", [{"a": 1}, 12, "2026-11-30T05:00:00Z" + " " * 100])
def test_a_start_time_that_is_not_a_short_text_skips_its_alert(api, users, node, starts):
    api.as_token(users["operator"])
    answer = api.post(
        URL, webhook(alert(fingerprint="bad", starts=starts), alert(fingerprint="good")), format="json"
    )
    assert [item["outcome"] for item in answer.json()["alerts"]] == ["skipped", "opened"], answer.json()


def test_gpu_and_nic_labels_out_of_range_make_the_fault_the_nodes(api, users, node):
    api.as_token(users["operator"])
    answer = api.post(
        URL,
        webhook(
            alert(fingerprint="a", gpu="-1"),
            alert(fingerprint="b", gpu="40000", starts="2026-11-30T05:01:00Z"),
            alert(fingerprint="c", alertname="InfinibandLinkDown", device="x" * 31, gpu=""),
        ),
        format="json",
    )
    assert [item["outcome"] for item in answer.json()["alerts"]] == ["opened", "merged", "opened"], (
        answer.json()
    )
    assert set(FaultEvent.objects.values_list("gpu_index", "nic_name")) == {(None, "")}


@pytest.fixture
def poisoned_faults(django_db_blocker):
    """A database that refuses one alert's fault with a constraint error (as any CHECK a field may carry would):
    a real refusal from PostgreSQL, raised by a trigger on the fault table for the fingerprint ``poison``."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION lockstep_test_poison() RETURNS trigger AS $$
            BEGIN
                IF NEW.details ->> 'fingerprint' = 'poison' THEN
                    RAISE EXCEPTION 'poisoned alert' USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER lockstep_test_poison BEFORE INSERT ON jobs_faultevent
                FOR EACH ROW EXECUTE FUNCTION lockstep_test_poison();
            """
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER lockstep_test_poison ON jobs_faultevent; DROP FUNCTION lockstep_test_poison();"
        )


@pytest.mark.parametrize("alone", [True, False], ids=["one-new-alert", "taken-in-together"])
def test_a_constraint_error_on_one_alert_skips_it_and_leaves_no_transaction_aborted(
    api, users, poisoned_faults, alone, caplog
):
    cluster = make_cluster()
    for i in range(3):
        make_node(cluster, f"dgx-{i}")
    api.as_token(users["operator"])
    if alone:  # the good alerts are known already: the poisoned one is the only new one, taken in alone
        api.post(URL, webhook(alert(fingerprint="good-0", Hostname="dgx-0")), format="json")
        api.post(URL, webhook(alert(fingerprint="good-2", Hostname="dgx-2")), format="json")
    group = webhook(
        alert(fingerprint="good-0", Hostname="dgx-0"),
        alert(fingerprint="poison", Hostname="dgx-1"),
        alert(fingerprint="good-2", Hostname="dgx-2"),
    )
    answer = api.post(URL, group, format="json")
    assert answer.status_code == 200, answer.content
    outcomes = answer.json()["alerts"]
    expected = ["duplicate", "skipped", "duplicate"] if alone else ["opened", "skipped", "opened"]
    assert [item["outcome"] for item in outcomes] == expected, outcomes
    assert outcomes[1]["reason"] == "the database refused a value of this alert"
    assert "poisoned alert" in caplog.text  # the database's own words are in the log, not in the answer
    # The transaction goes on: nothing of the poisoned alert, everything of the others.
    assert set(AlertRecord.objects.values_list("fingerprint", flat=True)) == {"good-0", "good-2"}
    assert FaultEvent.objects.count() == 2
