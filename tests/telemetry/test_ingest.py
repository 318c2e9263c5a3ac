import json
import time

import pytest

from controlplane.access import Role
from fleet.choices import NodeState
from jobs.models import FaultEvent
from telemetry import inventory
from telemetry.models import GPUSample, GPUState, IngestBatch, NICState, NodeMinute
from telemetry.tokens import agent_token_create, agent_token_revoke
from tests.conftest import make_user
from tests.fleet_factories import make_cluster, make_node
from tests.telemetry.helpers import batch, nic, reading

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/telemetry/"


@pytest.fixture(autouse=True)
def _fresh_inventory():
    inventory.forget()


@pytest.fixture
def world():
    cluster = make_cluster()
    other = make_cluster()
    node = make_node(cluster, "gpu-a1", rack="r1")
    make_node(cluster, "gpu-a2", rack="r1")
    make_node(other, "gpu-b1", rack="r9")
    _, raw = agent_token_create(actor=None, cluster=cluster, name="agents")
    return {"cluster": cluster, "other": other, "node": node, "token": raw}


def post(client, world, payload, token=None, content_type="application/json"):
    body = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
    return client.post(URL, body, content_type=content_type,
                       HTTP_AUTHORIZATION=f"Bearer {token or world['token']}")


def counts():
    return (IngestBatch.objects.count(), GPUSample.objects.count(), GPUState.objects.count(),
            NICState.objects.count(), NodeMinute.objects.count(), FaultEvent.objects.count())


def test_batch_stores_latest_state_samples_history(client, world):
    now = time.time()
    payload = batch("gpu-a1", readings=[reading(i, now - 10) for i in range(8)] + [reading(i, now) for i in range(8)],
                    nics=[nic("mlx5_0", now)])
    response = post(client, world, payload)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["readings"] == 16 and body["duplicate"] is False and body["faults"] == []
    assert GPUSample.objects.count() == 16
    assert GPUState.objects.filter(node=world["node"]).count() == 8
    state = GPUState.objects.get(gpu__node=world["node"], gpu__index=0)
    assert state.samples == 2 and state.temperature == 55.0
    assert NICState.objects.get(nic__name="mlx5_0", nic__node=world["node"]).link_state == "up"
    minutes = NodeMinute.objects.filter(node=world["node"])
    assert sum(m.samples for m in minutes) == 16 and max(m.temperature_max for m in minutes) == 55.0
    world["node"].refresh_from_db()
    assert world["node"].last_seen_at is not None


def test_duplicate_batch_changes_nothing(client, world):
    payload = batch("gpu-a1", readings=[reading(0)])
    assert post(client, world, payload).json()["duplicate"] is False
    before = counts()
    again = post(client, world, payload)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert counts() == before


@pytest.mark.parametrize("mutate, field", [
    (lambda b: b.update(node="gpu-b1"), "readings[0].node"),            # another cluster's node
    (lambda b: b.update(node="nope"), "readings[0].node"),
    (lambda b: b["readings"][0].update(gpu=9), "readings[0].gpu"),
    (lambda b: b.update(sent_at=time.time() + 3600), "sent_at"),
    (lambda b: b.update(sent_at=time.time() - 3600), "sent_at"),
    (lambda b: b["readings"][0].update(ts=time.time() + 3600), "readings[0].ts"),
    (lambda b: b["readings"][0]["fields"].update(DCGM_FI_DEV_GPU_UTIL=250), "readings[0].fields.DCGM_FI_DEV_GPU_UTIL"),
    (lambda b: b.update(batch_id="not-a-uuid"), "batch_id"),
    (lambda b: b.update(extra=1), "body"),
    (lambda b: b.pop("readings"), "body"),
    (lambda b: b["facility"].append({"ts": time.time(), "source": "redfish", "scope": "rack", "target": "r9",
                                     "metric": "inlet_temperature_celsius", "value": 25.0}), "facility[0].target"),
])
def test_bad_batches_are_400_naming_the_field_and_store_nothing(client, world, mutate, field):
    payload = batch("gpu-a1", readings=[reading(0), reading(1)], nics=[nic("mlx5_0")])
    mutate(payload)
    before = counts()
    response = post(client, world, payload)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert counts() == before


@pytest.mark.parametrize("body, expected", [(b"{not json", 400), (b"[]", 400), (b"", 415), ("\u00ff".encode("latin-1"), 400)])
def test_garbage_is_4xx(client, world, body, expected):
    assert post(client, world, body).status_code == expected


def test_wrong_content_type_is_415_and_oversize_is_413(client, world, settings):
    assert post(client, world, "x=1", content_type="text/plain").status_code == 415
    settings.TELEMETRY_MAX_BATCH_BYTES = 100
    assert post(client, world, batch("gpu-a1", readings=[reading(0)])).status_code == 413


def test_tokens_are_bound_and_checked(client, world):
    payload = batch("gpu-a1", readings=[reading(0)])
    assert client.post(URL, json.dumps(payload), content_type="application/json").status_code == 401
    assert post(client, world, payload, token="lsa_abcdefgh_" + "x" * 43).status_code == 401
    user = make_user(Role.PROVIDER_ADMIN)
    from tenancy.services import token_create

    _, user_token = token_create(actor=user, owner=user, name="u", scope="write")
    assert post(client, world, payload, token=user_token).status_code == 401  # a user token is not an agent token
    from telemetry.models import AgentToken

    agent_token_revoke(actor=None, token=AgentToken.objects.get(cluster=world["cluster"]))
    response = post(client, world, payload)
    assert response.status_code == 401 and "revoked" in response.json()["detail"]


def test_hard_faults_become_fault_events(client, world):
    now = time.time()
    post(client, world, batch("gpu-a1", readings=[reading(3, now - 20)], nics=[nic("mlx5_2", now - 20)]))
    response = post(client, world, batch(
        "gpu-a1",
        readings=[reading(3, now - 10, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2)],
        nics=[nic("mlx5_2", now - 10, link_state="down", link_downed=1)],
        events=[{"ts": now - 5, "type": "xid", "xid": 79, "gpu": 5, "uuid": "GPU-5"}],
    ))
    assert response.status_code == 200, response.content
    kinds = sorted(FaultEvent.objects.values_list("kind", flat=True))
    assert kinds == ["ecc_uncorrectable", "gpu_xid", "nic_down"]
    xid = FaultEvent.objects.get(kind="gpu_xid")
    assert xid.xid == 79 and "agent" in xid.sources
    assert len(response.json()["faults"]) == 3


def test_older_reading_does_not_overwrite_latest_state(client, world):
    now = time.time()
    post(client, world, batch("gpu-a1", readings=[reading(0, now, DCGM_FI_DEV_GPU_TEMP=70.0)]))
    post(client, world, batch("gpu-a1", readings=[reading(0, now - 60, DCGM_FI_DEV_GPU_TEMP=40.0)]))
    state = GPUState.objects.get(gpu__node=world["node"], gpu__index=0)
    assert state.temperature == 70.0
    assert GPUSample.objects.count() == 2


def test_features_follow_a_warming_gpu_and_rising_ecc(client, world):
    start = time.time() - 600
    for step in range(30):
        post(client, world, batch("gpu-a1", readings=[reading(
            0, start + step * 10, DCGM_FI_DEV_GPU_TEMP=60.0 + step * 0.5, DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=step * 3)]))
    state = GPUState.objects.get(gpu__node=world["node"], gpu__index=0)
    # 0.5 °C every 10 s is 180 °C/h; after 5 minutes the fast/slow estimate has climbed to about a seventh of it
    assert 20 < state.temperature_trend < 180
    assert state.sbe_rate > 300


def test_relay_batch_reports_many_nodes(client, world):
    now = time.time()
    payload = batch(None, readings=[reading(0, now, node="gpu-a1"), reading(0, now, node="gpu-a2")])
    assert post(client, world, payload).status_code == 200
    assert GPUState.objects.count() == 2


def test_node_state_untouched_by_ingest(client, world):
    post(client, world, batch("gpu-a1", readings=[reading(0)]))
    world["node"].refresh_from_db()
    assert world["node"].state == NodeState.READY


def test_temperature_noise_does_not_look_like_a_trend(client, world):
    import random

    rng = random.Random(4)
    start = time.time() - 1800
    for step in range(90):
        post(client, world, batch("gpu-a1", readings=[reading(0, start + step * 10,
                                                              DCGM_FI_DEV_GPU_TEMP=60.0 + rng.gauss(0, 0.8))]))
    state = GPUState.objects.get(gpu__node=world["node"], gpu__index=0)
    assert abs(state.temperature_trend) < 3.0   # °C per hour: jitter of ±0.8 °C every 10 s is no trend
