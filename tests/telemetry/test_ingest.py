import json
import time
import uuid

import pytest

from controlplane.access import Role
from fleet.choices import NodeState
from jobs.models import FaultEvent
from telemetry import inventory
from telemetry.models import (
    FacilitySample,
    FacilityState,
    GPUSample,
    GPUState,
    IngestBatch,
    NICState,
    NodeMinute,
)
from telemetry.services import ingest
from telemetry.services.ingest import telemetry_ingest
from telemetry.services.tokens import agent_token_create, agent_token_revoke
from tests.support.factories import make_cluster, make_node, make_user
from tests.support.statements import SentStatements
from tests.support.telemetry import batch, nic, reading

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/telemetry/"


@pytest.fixture(autouse=True)
def _fresh_inventory():
    inventory.forget()


@pytest.fixture(autouse=True, params=["postgresql", "portable"])
def store(request, monkeypatch):
    """Every test runs with both ways of storing a batch: PostgreSQL's two statements, and the ORM's that SQLite
    (local runs) uses."""
    if request.param == "portable":
        monkeypatch.setattr(ingest, "PostgresStore", ingest.PortableStore)
    return request.param


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
    return client.post(
        URL, body, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token or world['token']}"
    )


def counts():
    return (
        IngestBatch.objects.count(),
        GPUSample.objects.count(),
        GPUState.objects.count(),
        NICState.objects.count(),
        NodeMinute.objects.count(),
        FaultEvent.objects.count(),
    )


def test_batch_stores_latest_state_samples_history(client, world):
    now = time.time()
    payload = batch(
        "gpu-a1",
        readings=[reading(i, now - 10) for i in range(8)] + [reading(i, now) for i in range(8)],
        nics=[nic("mlx5_0", now)],
    )
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


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda b: b.update(node="gpu-b1"), "readings[0].node"),  # another cluster's node
        (lambda b: b.update(node="nope"), "readings[0].node"),
        (lambda b: b["readings"][0].update(gpu=9), "readings[0].gpu"),
        (lambda b: b.update(sent_at=time.time() + 3600), "sent_at"),
        (lambda b: b.update(sent_at=time.time() - 3600), "sent_at"),
        (lambda b: b["readings"][0].update(ts=time.time() + 3600), "readings[0].ts"),
        (
            lambda b: b["readings"][0]["fields"].update(DCGM_FI_DEV_GPU_UTIL=250),
            "readings[0].fields.DCGM_FI_DEV_GPU_UTIL",
        ),
        (lambda b: b.update(batch_id="not-a-uuid"), "batch_id"),
        (lambda b: b.update(extra=1), "body"),
        (lambda b: b.pop("readings"), "body"),
        (
            lambda b: b["facility"].append(
                {
                    "ts": time.time(),
                    "source": "redfish",
                    "scope": "rack",
                    "target": "r9",
                    "metric": "inlet_temperature_celsius",
                    "value": 25.0,
                }
            ),
            "facility[0].target",
        ),
    ],
)
def test_bad_batches_are_400_naming_the_field_and_store_nothing(client, world, mutate, field):
    payload = batch("gpu-a1", readings=[reading(0), reading(1)], nics=[nic("mlx5_0")])
    mutate(payload)
    before = counts()
    response = post(client, world, payload)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert counts() == before


@pytest.mark.parametrize(
    "body, expected", [(b"{not json", 400), (b"[]", 400), (b"", 415), ("\u00ff".encode("latin-1"), 400)]
)
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
    assert (
        post(client, world, payload, token=user_token).status_code == 401
    )  # a user token is not an agent token
    from telemetry.models import AgentToken

    agent_token_revoke(actor=None, token=AgentToken.objects.get(cluster=world["cluster"]))
    response = post(client, world, payload)
    assert response.status_code == 401 and "revoked" in response.json()["detail"]


def test_hard_faults_become_fault_events(client, world):
    now = time.time()
    post(client, world, batch("gpu-a1", readings=[reading(3, now - 20)], nics=[nic("mlx5_2", now - 20)]))
    response = post(
        client,
        world,
        batch(
            "gpu-a1",
            readings=[reading(3, now - 10, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=2)],
            nics=[nic("mlx5_2", now - 10, link_state="down", link_downed=1)],
            events=[{"ts": now - 5, "type": "xid", "xid": 79, "gpu": 5, "uuid": "GPU-5"}],
        ),
    )
    assert response.status_code == 200, response.content
    kinds = sorted(FaultEvent.objects.values_list("kind", flat=True))
    assert kinds == ["ecc_uncorrectable", "gpu_xid", "nic_down"]
    xid = FaultEvent.objects.get(kind="gpu_xid")
    assert xid.xid == 79 and "agent" in xid.sources
    assert len(response.json()["faults"]) == 3


def test_a_fault_batch_leaves_the_clusters_credentials_encrypted(client, world, monkeypatch):
    """Taking in a batch's faults reads their nodes' cluster without its driver credentials: nothing on the intake
    needs them, and reading them would decrypt them on every fault batch."""
    from controlplane import security_crypto

    now = time.time()
    post(client, world, batch("gpu-a1", readings=[reading(3, now - 20)], nics=[nic("mlx5_2", now - 20)]))
    decrypted, read_stored = [], security_crypto.read_stored

    def counted(value):
        decrypted.append(value)
        return read_stored(value)

    # every encrypted column is read through this (a compiled query keeps the field's converter, not this name)
    monkeypatch.setattr(security_crypto, "read_stored", counted)
    response = post(
        client,
        world,
        batch("gpu-a1", nics=[nic("mlx5_2", now - 10, link_state="down", link_downed=1)]),
    )
    assert response.status_code == 200 and len(response.json()["faults"]) == 1, response.content
    assert decrypted == []
    stored = FaultEvent.objects.get().node.cluster
    assert stored.connection == world["cluster"].connection  # read when asked for


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
        post(
            client,
            world,
            batch(
                "gpu-a1",
                readings=[
                    reading(
                        0,
                        start + step * 10,
                        DCGM_FI_DEV_GPU_TEMP=60.0 + step * 0.5,
                        DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=step * 3,
                    )
                ],
            ),
        )
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
        post(
            client,
            world,
            batch(
                "gpu-a1",
                readings=[reading(0, start + step * 10, DCGM_FI_DEV_GPU_TEMP=60.0 + rng.gauss(0, 0.8))],
            ),
        )
    state = GPUState.objects.get(gpu__node=world["node"], gpu__index=0)
    assert abs(state.temperature_trend) < 3.0  # °C per hour: jitter of ±0.8 °C every 10 s is no trend


def node_batch(node: str, ts: float, **fields) -> dict:
    """One node agent's batch as bench/load.py sends it: 8 GPUs, 8 InfiniBand ports, and two facility readings."""
    return batch(
        node,
        readings=[reading(g, ts, **fields) for g in range(8)],
        nics=[nic(f"mlx5_{n}", ts, port_xmit_wait=int(ts) + n) for n in range(8)],
        facility=[
            {
                "ts": ts,
                "source": "redfish",
                "scope": "node",
                "target": node,
                "sensor": "inlet",
                "metric": "inlet_temperature_celsius",
                "value": 24.5,
            },
            {
                "ts": ts,
                "source": "redfish",
                "scope": "rack",
                "target": "r1",
                "metric": "pdu_power_watts",
                "value": 41_000.0,
            },
        ],
    )


def test_a_batch_is_two_statements_whatever_its_size(world, store):
    if store != "postgresql":
        pytest.skip("the statement count is the PostgreSQL store's")
    now = time.time()
    telemetry_ingest(cluster=world["cluster"], body=json.dumps(node_batch("gpu-a1", now - 20)).encode())
    one_node = node_batch("gpu-a1", now - 10)
    with SentStatements() as one:
        result = telemetry_ingest(cluster=world["cluster"], body=json.dumps(one_node).encode())
    assert result.readings == 8 and result.nics == 8 and result.facility == 2 and not result.duplicate
    assert len(one.work()) == 2, one.work()  # record the batch + lock and read state; write every table
    relay = batch(
        None,
        readings=[
            reading(g, now - 5 + step, node=node)
            for node in ("gpu-a1", "gpu-a2")
            for g in range(8)
            for step in range(3)
        ],
        nics=[nic(f"mlx5_{n}", now - 5, node=node) for node in ("gpu-a1", "gpu-a2") for n in range(8)],
    )
    with SentStatements() as many:
        result = telemetry_ingest(cluster=world["cluster"], body=json.dumps(relay).encode())
    assert result.readings == 48 and len(many.work()) == 2, many.work()
    with SentStatements() as again:
        assert telemetry_ingest(cluster=world["cluster"], body=json.dumps(one_node).encode()).duplicate
    assert len(again.work()) == 1, (
        again.work()
    )  # a duplicate is found by the first statement, and locks nothing
    assert GPUState.objects.get(gpu__node=world["node"], gpu__index=0).samples == 5


def test_facility_series_are_stored_and_folded(client, world):
    now = time.time()

    def rack(ts, value):
        return {
            "ts": ts,
            "source": "redfish",
            "scope": "rack",
            "target": "r1",
            "device": "cdu-1",
            "metric": "cdu_supply_temperature_celsius",
            "value": value,
        }

    assert post(client, world, batch(None, facility=[rack(now - 30, 20.0)])).status_code == 200
    assert (
        post(client, world, batch(None, facility=[rack(now - 10, 30.0), rack(now - 20, 25.0)])).status_code
        == 200
    )
    assert (
        post(client, world, batch(None, facility=[rack(now - 25, 10.0)])).status_code == 200
    )  # a late replay
    assert FacilitySample.objects.filter(target="r1").count() == 4
    state = FacilityState.objects.get(cluster=world["cluster"], scope="rack", target="r1")
    assert state.series == "cdu-1||cdu_supply_temperature_celsius" and state.value == 30.0
    assert abs(state.ts.timestamp() - (now - 10)) < 1e-3
    # 20 then 25 then 30 in time order (the replayed 10 is history only): the EWMA moved from 20 towards 30
    assert state.ewma == pytest.approx(20.0 + 0.1 * 5.0 + 0.1 * (30.0 - (20.0 + 0.1 * 5.0)))
    assert 20.0 < state.baseline < state.ewma and state.trend > 0


def test_counters_sent_as_whole_floats_are_counters_and_out_of_range_is_400(client, world):
    # JSON Schema calls 3.0 an integer, so the batch is valid: it is stored as 3
    response = post(
        client,
        world,
        batch(
            "gpu-a1",
            readings=[reading(0, DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=3.0, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=0.0)],
            nics=[nic("mlx5_0", link_downed=1.0, symbol_error=0.0)],
        ),
    )
    assert response.status_code == 200, response.content
    assert GPUState.objects.get(gpu__node=world["node"], gpu__index=0).sbe_total == 3
    assert GPUSample.objects.get().sbe_total == 3
    assert NICState.objects.get(nic__node=world["node"], nic__name="mlx5_0").link_downed == 1
    before = counts()
    response = post(
        client, world, batch("gpu-a1", readings=[reading(1, DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=10**20)])
    )
    assert response.status_code == 400, response.content
    assert counts() == before


def _snapshot() -> dict:
    """Every telemetry row the batches wrote, without ids and wall-clock times."""
    return {
        "samples": sorted(
            GPUSample.objects.values_list(
                "gpu_id",
                "ts",
                "temperature",
                "power",
                "utilization",
                "sbe_total",
                "dbe_total",
                "nvlink_errors",
                "throttle_reasons",
            )
        ),
        "gpus": sorted(tuple(row.values()) for row in GPUState.objects.values()),
        "nics": sorted(tuple(row.values()) for row in NICState.objects.values()),
        "minutes": sorted(
            NodeMinute.objects.values_list(
                "node_id",
                "minute",
                "samples",
                "temperature_max",
                "temperature_sum",
                "power_sum",
                "utilization_sum",
            )
        ),
        "facility_samples": sorted(
            tuple(v for k, v in row.items() if k != "id") for row in FacilitySample.objects.values()
        ),
        "facility": sorted(
            tuple(v for k, v in row.items() if k != "id") for row in FacilityState.objects.values()
        ),
        "batches": sorted(
            IngestBatch.objects.values_list("batch_id", "readings", "nics", "events", "facility", "faults")
        ),
    }


def test_both_stores_write_the_same_rows(world, store, monkeypatch):
    if store != "postgresql":
        pytest.skip("compares the two stores in one test")
    now = time.time()
    ids = [str(uuid.uuid4()) for _ in range(6)]
    bodies = [
        node_batch("gpu-a1", now - 40, DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL=2)
        | {"batch_id": ids[0]},
        node_batch(
            "gpu-a1",
            now - 30,
            DCGM_FI_DEV_GPU_TEMP=61.5,
            DCGM_FI_DEV_ECC_SBE_VOL_TOTAL=4,
            DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL=2,
        )
        | {"batch_id": ids[1]},
        batch(
            "gpu-a1",
            batch_id=ids[2],
            readings=[
                reading(g, now - 20, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL=1, DCGM_FI_DEV_GPU_TEMP=95.0)
                for g in range(2)
            ]
            + [reading(3, now - 35)],  # and a late replay
            nics=[nic("mlx5_2", now - 20, link_state="down", link_downed=1, symbol_error=7)],
            events=[{"ts": now - 20, "type": "xid", "xid": 79, "gpu": 5}],
        ),
        node_batch("gpu-a1", now - 40) | {"batch_id": ids[0]},  # a duplicate
        batch(
            None,
            batch_id=ids[4],
            readings=[
                reading(g, now - 10 + step, node=node)
                for node in ("gpu-a1", "gpu-a2")
                for g in range(8)
                for step in range(2)
            ],
            nics=[nic(f"mlx5_{n}", now - 10, node="gpu-a2", port_xmit_wait=n * 1000) for n in range(8)],
        ),
        node_batch("gpu-a2", now - 5) | {"batch_id": ids[5]},
    ]
    results = {}
    for name in ("postgresql", "portable"):
        if name == "portable":
            monkeypatch.setattr(ingest, "PostgresStore", ingest.PortableStore)
        answers = [
            telemetry_ingest(cluster=world["cluster"], body=json.dumps(body).encode()).as_dict()
            for body in bodies
        ]
        results[name] = ([(a["duplicate"], a["readings"], len(a["faults"])) for a in answers], _snapshot())
        for model in (
            GPUSample,
            GPUState,
            NICState,
            NodeMinute,
            FacilitySample,
            FacilityState,
            IngestBatch,
            FaultEvent,
        ):
            model.objects.all().delete()
    assert results["postgresql"][0] == [
        (False, 8, 0),
        (False, 8, 0),
        (False, 3, 6),
        (True, 8, 0),
        (False, 32, 0),
        (False, 8, 0),
    ]
    assert results["postgresql"] == results["portable"]
