"""Fuzzers that keep finding (issue 25): Alertmanager webhooks drawn from the v4 payload's shape, with every
field also drawn wrong, and websocket frames. Whatever arrives, the webhook answers 200 with one outcome per
alert (or a 400 for an envelope it cannot read) and never a 5xx; the socket answers every frame and stays open."""

import json
import string

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from controlplane.asgi import application
from tests.support.factories import make_cluster, make_node, token_header

URL = "/api/v1/ingest/alertmanager/"
OUTCOMES = {"opened", "merged", "duplicate", "resolved", "skipped"}
FUZZ = hypothesis_settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
json_scalar = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text
)
anything = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
# RFC 3339 as Alertmanager writes it, and the ways it goes wrong: no zone, not a time, year 1, far future.
times = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.datetimes().map(lambda d: d.isoformat()),
    st.sampled_from(
        ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "yesterday", "", "2026-13-45T99:00:00Z"]
    ),
    anything,
)
label_names = (
    st.sampled_from(
        [
            "alertname",
            "Hostname",
            "hostname",
            "node",
            "instance",
            "gpu",
            "xid",
            "device",
            "lockstep_kind",
            "err_code",
        ]
    )
    | text
)
label_values = (
    st.sampled_from(
        [
            "GPUXidError",
            "NodeDown",
            "fuzz-0",
            "fuzz-1:9100",
            "79",
            "inf",
            "-1",
            "1e400",
            "nan",
            "nic_down",
            "meteor",
            "fuzz-\x00",
        ]
    )
    | json_scalar
)
labels = st.dictionaries(label_names, label_values, max_size=6) | anything
alert = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]) | anything,
        "labels": labels,
        "annotations": st.dictionaries(text, label_values, max_size=3) | anything,
        "startsAt": times,
        "endsAt": times,
        "generatorURL": text,
        "fingerprint": st.text(alphabet=string.hexdigits, min_size=16, max_size=16) | text | anything,
    }
)
webhook = st.fixed_dictionaries(
    {
        "version": st.just("4"),
        "status": st.sampled_from(["firing", "resolved"]),
        "receiver": text,
        "groupLabels": labels,
        "commonLabels": labels,
        "commonAnnotations": labels,
        "externalURL": text,
        "alerts": st.lists(alert, max_size=6),
    }
)
envelope = webhook | st.fixed_dictionaries({"version": anything, "alerts": anything}) | anything


@pytest.mark.django_db
def test_alertmanager_webhooks_drawn_from_the_v4_shape_never_fail_the_group(api, users):
    cluster = make_cluster()
    make_node(cluster, "fuzz-0")
    make_node(cluster, "fuzz-1")
    api.as_token(users["operator"])
    seen = {"200": 0, "400": 0}

    @FUZZ
    @given(payload=webhook)
    def well_formed(payload):
        with transaction.atomic():
            answer = api.post(URL, json.dumps(payload), content_type="application/json")
            transaction.set_rollback(True)
        assert answer.status_code == 200, (payload, answer.content[:300])
        outcomes = answer.json()["alerts"]
        assert len(outcomes) == len(payload["alerts"]) and {o["outcome"] for o in outcomes} <= OUTCOMES
        seen["200"] += 1

    @FUZZ
    @given(payload=envelope)
    def any_envelope(payload):
        with transaction.atomic():
            answer = api.post(URL, json.dumps(payload), content_type="application/json")
            transaction.set_rollback(True)
        assert answer.status_code in (200, 400), (payload, answer.status_code, answer.content[:300])
        seen[str(answer.status_code)] += 1

    well_formed()
    any_envelope()
    assert seen["200"] >= 40 and seen["400"] >= 1, seen


frames = st.one_of(
    anything.map(lambda value: {"text_data": json.dumps(value)}),
    st.fixed_dictionaries({"subscribe": st.lists(text | anything, max_size=30) | anything}).map(
        lambda value: {"text_data": json.dumps(value)}
    ),
    st.fixed_dictionaries({"unsubscribe": anything}).map(lambda value: {"text_data": json.dumps(value)}),
    st.text(min_size=1, max_size=200).map(lambda value: {"text_data": value}),
    st.binary(min_size=1, max_size=200).map(lambda value: {"bytes_data": value}),
    st.integers(1, 3000).map(lambda depth: {"text_data": '{"subscribe": ' + "[" * depth + "]" * depth + "}"}),
)


def draw_frames(count: int) -> list[dict]:
    """``count`` frames drawn by hypothesis (collected, then sent over one socket in the event loop of the test)."""
    drawn = []

    @hypothesis_settings(
        max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(frame=frames)
    def collect(frame):
        drawn.append(frame)

    collect()
    return drawn


@pytest.mark.django_db(transaction=True)
async def test_websocket_frames_drawn_at_random_are_each_answered(users):
    header = (await sync_to_async(token_header)(users["tenant-viewer"], "read"))[
        "HTTP_AUTHORIZATION"
    ].encode()
    socket = WebsocketCommunicator(application, "/ws/events/", headers=[(b"authorization", header)])
    connected, _ = await socket.connect(timeout=5)
    assert connected and (await socket.receive_json_from(timeout=5))["type"] == "hello"
    drawn = await sync_to_async(draw_frames)(150)
    for frame in drawn:
        await socket.send_to(**frame)
        answer = await socket.receive_json_from(timeout=5)
        assert answer["type"] in ("error", "subscribed", "unsubscribed"), (frame, answer)
    await socket.send_json_to({"subscribe": ["fleet"]})
    assert (await socket.receive_json_from(timeout=5))["type"] == "subscribed"  # still open after all of it
    await socket.disconnect()
    assert len(drawn) >= 100
