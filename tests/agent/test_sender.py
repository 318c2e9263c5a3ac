"""The sender and spool, against a live HTTP receiver on a loopback port (no mocked requests)."""

import json

import pytest
from lockstep_agent.batch import make_batch
from lockstep_agent.sender import Outcome, Sender, ingest_url
from lockstep_agent.spool import Spool


def new_batch(number: int) -> dict:
    batch = make_batch(node="gpu-001", gpu_status="no_nvml")
    batch["nics"] = [
        {
            "ts": batch["created_at"],
            "name": "eth0",
            "kind": "ethernet",
            "link_state": "up",
            "fields": {"rx_errors": number},
        }
    ]
    return batch


def make_sender(receiver, tmp_path, **options) -> Sender:
    options = {"attempts": 2, "backoff": 0.01, "max_backoff": 0.05, "timeout": 2, **options}
    return Sender(url=receiver.url, token="agent-token-123", spool=Spool(tmp_path / "spool"), **options)


def test_a_batch_makes_a_real_round_trip(receiver, tmp_path, batch_validator):
    sender = make_sender(receiver, tmp_path)
    batch = new_batch(1)
    assert sender.ship(batch) is Outcome.SENT

    (received,) = receiver.batches
    assert receiver.paths == ["/api/v1/ingest/telemetry/"]
    assert received["batch_id"] == batch["batch_id"]
    headers = receiver.headers[0]
    assert headers["Authorization"] == "Bearer agent-token-123"
    assert headers["Content-Type"] == "application/json"
    assert headers["Idempotency-Key"] == batch["batch_id"]
    assert headers["User-Agent"].startswith("lockstep-agent/")
    batch_validator.validate(received)
    assert sender.spool.is_empty()


def test_retries_with_back_off_before_spooling(receiver, tmp_path):
    receiver.answers = [503]
    sender = make_sender(receiver, tmp_path, attempts=3)
    assert sender.ship(new_batch(1)) is Outcome.SENT
    assert receiver.attempts == 2
    assert len(receiver.batches) == 1


def test_spool_across_an_outage_replays_in_order_none_lost_none_duplicated(
    receiver, tmp_path, batch_validator
):
    sender = make_sender(receiver, tmp_path)
    first = new_batch(0)
    assert sender.ship(first) is Outcome.SENT

    receiver.stop()  # the control plane goes away
    during = [new_batch(n) for n in range(1, 6)]
    for batch in during:
        assert sender.ship(batch) is Outcome.RETRY
    assert len(sender.spool) == 5
    lines = sender.spool.path.read_text().splitlines()
    assert [json.loads(line)["batch_id"] for line in lines] == [b["batch_id"] for b in during]

    receiver.start()  # it comes back on the same port
    sender._next_replay_at = 0  # skip the back-off wait
    last = new_batch(6)
    assert sender.ship(last) is Outcome.SENT

    expected = [b["batch_id"] for b in [first, *during, last]]
    assert [b["batch_id"] for b in receiver.batches] == expected
    assert len(set(expected)) == len(receiver.batches)
    assert [b["nics"][0]["fields"]["rx_errors"] for b in receiver.batches] == list(range(7))
    for batch in receiver.batches:
        batch_validator.validate(batch)
    # Replayed batches keep their created_at but carry a fresh sent_at for the server's skew check.
    replayed = receiver.batches[1]
    assert replayed["sent_at"] > replayed["created_at"]
    assert sender.spool.is_empty()
    assert not sender.spool.path.exists()  # emptied once everything is delivered


def test_the_spool_survives_a_restart_of_the_agent(receiver, tmp_path):
    receiver.stop()
    sender = make_sender(receiver, tmp_path)
    batches = [new_batch(n) for n in range(3)]
    for batch in batches:
        sender.ship(batch)

    receiver.start()
    restarted = make_sender(receiver, tmp_path)  # a new process reading the same spool directory
    assert restarted.drain() == 3
    assert [b["batch_id"] for b in receiver.batches] == [b["batch_id"] for b in batches]


def test_replay_stops_at_the_first_failure_and_resumes_where_it_stopped(receiver, tmp_path):
    receiver.stop()
    sender = make_sender(receiver, tmp_path)
    batches = [new_batch(n) for n in range(4)]
    for batch in batches:
        sender.ship(batch)
    receiver.start()
    receiver.answers = [202, 202, 503]  # two replays land, the third is refused for now
    assert sender.drain(force=True) == 2
    assert len(sender.spool) == 2
    assert sender.drain(force=True) == 2
    assert [b["batch_id"] for b in receiver.batches] == [b["batch_id"] for b in batches]


def test_a_crash_after_delivery_resends_once_with_the_same_batch_id(receiver, tmp_path):
    """If the agent dies after the server accepted a batch but before the spool recorded it, the batch is
    sent again on restart, with the same batch_id: at least once, never lost, duplicates recognisable."""
    receiver.stop()
    spool = Spool(tmp_path / "spool")
    sender = Sender(url=receiver.url, token="t", spool=spool, attempts=1, backoff=0.01)
    batch = new_batch(1)
    sender.ship(batch)
    receiver.start()
    ((end, pending),) = list(spool.pending())
    assert sender.post(pending)[0] is Outcome.SENT  # delivered... and the process dies before commit(end)

    assert make_sender(receiver, tmp_path).drain() == 1
    assert [b["batch_id"] for b in receiver.batches] == [batch["batch_id"], batch["batch_id"]]


def test_a_batch_the_server_refuses_is_set_aside_not_retried_forever(receiver, tmp_path):
    receiver.stop()
    sender = make_sender(receiver, tmp_path)
    bad, good = new_batch(1), new_batch(2)
    sender.ship(bad)
    sender.ship(good)
    receiver.start()
    receiver.answers = [400]
    assert sender.drain(force=True) == 2
    assert [b["batch_id"] for b in receiver.batches] == [good["batch_id"]]
    (rejected,) = [json.loads(line) for line in sender.spool.rejected_path.read_text().splitlines()]
    assert rejected["batch"]["batch_id"] == bad["batch_id"]
    assert rejected["reason"].startswith("HTTP 400")


@pytest.mark.parametrize("status", [401, 403, 429, 500, 502])
def test_auth_and_server_errors_keep_the_batch(receiver, tmp_path, status):
    receiver.answers = [status, status]
    sender = make_sender(receiver, tmp_path)
    assert sender.ship(new_batch(1)) is Outcome.RETRY
    assert len(sender.spool) == 1
    assert sender.drain(force=True) == 1


def test_a_torn_last_line_is_cut_off(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.append(new_batch(1))
    with open(spool.path, "a") as handle:
        handle.write('{"batch_id": "half a ba')  # the process died mid-append
    reopened = Spool(tmp_path / "spool")
    reopened.append(new_batch(2))
    assert len(reopened) == 2


def test_ingest_url_accepts_a_base_or_the_full_path():
    assert ingest_url("https://lockstep.example") == "https://lockstep.example/api/v1/ingest/telemetry/"
    assert ingest_url("https://lockstep.example/") == "https://lockstep.example/api/v1/ingest/telemetry/"
    assert (
        ingest_url("http://127.0.0.1:8000/api/v1/ingest/telemetry/")
        == "http://127.0.0.1:8000/api/v1/ingest/telemetry/"
    )
