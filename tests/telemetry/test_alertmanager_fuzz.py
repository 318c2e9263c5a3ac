"""A bounded fuzz of the Alertmanager intake (issue 54): whatever a group's alerts hold, the answer is 200 with one
outcome per alert, a skipped alert says why, and the good alert sent along with them is always taken in."""

import itertools

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from telemetry.models import AlertRecord
from tests.support.factories import make_cluster, make_node

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/alertmanager/"
OUTCOMES = {"opened", "merged", "duplicate", "resolved", "skipped"}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),  # JSON has no NaN
    st.text(max_size=30),
    st.sampled_from(["-5", "79", "79.0", "1e400", "NaN", "-0", "65536", "2147483648", "dgx-1", "0x4f"]),
)
label_names = st.sampled_from(
    [
        "alertname",
        "Hostname",
        "hostname",
        "node",
        "instance",
        "gpu",
        "xid",
        "err_code",
        "device",
        "lockstep_kind",
    ]
)
labels = st.one_of(
    st.dictionaries(st.one_of(label_names, st.text(max_size=10)), scalars, max_size=8),
    st.dictionaries(
        label_names,
        st.sampled_from(
            ["DCGM_XID", "GPUXidError", "NodeDown", "dgx-1", "-5", "3", "nvlink_error", "meteor"]
        ),
        max_size=6,
    ),
    scalars,
    st.lists(scalars, max_size=3),
)
wild = st.fixed_dictionaries(
    {},
    optional={
        "status": st.one_of(st.sampled_from(["firing", "resolved"]), scalars),
        "labels": labels,
        "annotations": labels,
        "startsAt": st.one_of(
            st.sampled_from(
                [
                    "2026-11-30T05:00:00Z",
                    "2026-11-30T05:00:00",
                    "0001-01-01T00:00:00Z",
                    "9999-12-31T23:59:59Z",
                ]
            ),
            scalars,
        ),
        "endsAt": scalars,
        "fingerprint": st.one_of(st.text(max_size=70), scalars),
    },
)


values = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["-5", "79.5", "1e400", "NaN", "-0", "65536", "2147483648", "0x4f", "", "x" * 101]),
    st.text(max_size=8),
)


@st.composite
def near_good(draw):
    """A good alert on the known node with one or two of its labels, annotations or fields changed."""
    alert = good(draw(st.integers(1000, 10**6)))
    alert["fingerprint"] = f"near-{draw(st.integers(0, 10**9))}"
    for _ in range(draw(st.integers(1, 2))):
        where = draw(st.sampled_from(["labels", "labels", "annotations", "field"]))
        if where == "field":
            alert[draw(st.sampled_from(["status", "startsAt", "endsAt", "fingerprint"]))] = draw(scalars)
        else:
            name = draw(
                st.sampled_from(["xid", "gpu", "device", "Hostname", "value", "err_code", "lockstep_kind"])
            )
            alert[where] = {**alert[where], name: draw(values)}
    return alert


alerts = st.one_of(near_good(), near_good(), wild)


def good(i: int) -> dict:
    return {
        "status": "firing",
        "labels": {"alertname": "DCGM_XID", "Hostname": "dgx-1", "gpu": "0", "xid": "79"},
        "annotations": {},
        "startsAt": f"2026-11-30T05:{i % 60:02d}:{i // 60 % 60:02d}Z",
        "fingerprint": f"good-{i}",
    }


@pytest.fixture
def node():
    return make_node(make_cluster(), "dgx-1")


SENT = itertools.count()


@hypothesis_settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(group=st.lists(alerts, max_size=4), at=st.integers(0, 4))
def test_any_group_is_answered_200_one_outcome_an_alert_and_the_good_one_taken_in(
    api, users, node, group, at
):
    api.as_token(users["operator"])
    sent = good(next(SENT))
    group = [*group[:at], sent, *group[at:]]
    answer = api.post(URL, {"version": "4", "status": "firing", "alerts": group}, format="json")
    assert answer.status_code == 200, answer.content[:500]
    outcomes = answer.json()["alerts"]
    assert len(outcomes) == len(group)
    for outcome in outcomes:
        assert outcome["outcome"] in OUTCOMES
        assert outcome["outcome"] != "skipped" or outcome["reason"], outcome
    assert AlertRecord.objects.filter(fingerprint=sent["fingerprint"]).exists()
