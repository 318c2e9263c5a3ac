"""Operations with real processes: one beat schedules however many run; two web processes and two workers share
one PostgreSQL and one Redis; retention prunes while agents keep posting."""

import json
import os
import signal
import subprocess
import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta

import pytest
import redis

from controlplane.beat import LOCK_KEY
from controlplane.testing.processes import BASE_DIR, VENV_BIN, PrivateRedis, child_env, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Beat at test speed: a heartbeat (and so a lock renewal) every second, the lock lapses after three.
FAST_BEAT = {"HEARTBEAT_SECONDS": 1, "RECOVERY_ADVANCE_SECONDS": 1, "FAULT_SWEEP_SECONDS": 1, "OUTBOX_SWEEP_SECONDS": 1}
LOCK_SECONDS, RENEW_SECONDS = 3, 1
# Every one-second entry of the schedule, and how long each message may wait (its `expires` option).
EVERY_SECOND = {"jobs.recovery_advance": 2, "jobs.fault_sweep": 2, "controlplane.outbox_sweep": 2}


@contextmanager
def celery_beat(tmp_path, name: str, **env):
    """A real `celery -A controlplane beat` in its own process group, with its own schedule file."""
    log = tmp_path / f"beat-{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(VENV_BIN / "celery"), "-A", "controlplane", "beat", "--loglevel=info",
             "--schedule", str(tmp_path / f"beat-{name}-schedule")],
            cwd=BASE_DIR, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    process.log = log
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


def kill(process, sig=signal.SIGKILL) -> float:
    os.killpg(process.pid, sig)
    process.wait(15)
    return time.time()


def sent_messages(client: redis.Redis) -> list[dict]:
    """Every task message waiting in the broker's queue (no worker consumes it here): task, sender pid, time sent."""
    sent = []
    for raw in client.lrange("celery", 0, -1):
        headers = json.loads(raw)["headers"]
        if headers["task"] not in EVERY_SECOND:
            continue
        expires = datetime.fromisoformat(headers["expires"])
        sent.append({
            "task": headers["task"],
            "pid": int(headers["origin"].split("@")[0].removeprefix("gen")),
            "at": (expires - timedelta(seconds=EVERY_SECOND[headers["task"]])).timestamp(),
        })
    return sorted(sent, key=lambda message: message["at"])


def holder_pid(client: redis.Redis) -> int | None:
    value = client.get(LOCK_KEY)
    return int(value.decode().split(":")[1]) if value else None


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def started(beat) -> bool:
    return "beat: Starting..." in beat.log.read_text()


def test_two_beats_schedule_once_and_the_survivor_takes_over_when_the_holder_dies(tmp_path, private_redis):
    env = {**FAST_BEAT, "REDIS_URL": private_redis.url}
    client = redis.Redis.from_url(private_redis.url)
    with celery_beat(tmp_path, "a", **env) as a, celery_beat(tmp_path, "b", **env) as b:
        beats = {a.pid: a, b.pid: b}
        wait_for(lambda: started(a) and started(b) and holder_pid(client) in beats, 60,
                 what=f"two beats, one holding the lock ({a.log.read_text()[-400:]} {b.log.read_text()[-400:]})")
        time.sleep(1.5)                                   # both beats tick: the one holding and the one standing by
        window_start = time.time()
        time.sleep(8)
        window_end = time.time()
        holder = beats[holder_pid(client)]
        survivor = b if holder is a else a
        killed_at = kill(holder)
        wait_for(lambda: holder_pid(client) == survivor.pid, LOCK_SECONDS + 5, 0.05, what="the survivor to take the lock")
        time.sleep(5)
        messages = sent_messages(client)
        assert survivor.poll() is None, survivor.log.read_text()[-2000:]

    before = [m for m in messages if m["at"] < killed_at]
    after = [m for m in messages if m["at"] >= killed_at]
    # Only the holder sent while both ran; only the survivor after it died.
    assert {m["pid"] for m in before} == {holder.pid}
    assert {m["pid"] for m in after} == {survivor.pid}
    for task in EVERY_SECOND:
        times = [m["at"] for m in messages if m["task"] == task]
        in_window = [t for t in times if window_start <= t < window_end]
        # Once a second over eight seconds, not twice; no two sends of one entry closer than its interval allows.
        assert 7 <= len(in_window) <= 9, (task, len(in_window))
        assert min(gaps(times)) > 0.8, (task, gaps(times))
        first_after = min(t for t in times if t >= killed_at)
        # The survivor takes over within the lock's lifetime and one renewal interval.
        assert first_after - killed_at < LOCK_SECONDS + RENEW_SECONDS + 1.0, (task, first_after - killed_at)
        print(f"{task}: {len(in_window)} sends in 8 s with two beats; first send {first_after - killed_at:.2f} s "
              "after the holder was killed")
    # The one standing by sent nothing before it took the lock.
    assert "Sending due task" not in survivor.log.read_text().split("took the lock")[0]


def test_a_stopped_holder_hands_over_at_once_and_beats_survive_a_redis_restart(tmp_path):
    server = PrivateRedis().start()
    env = {**FAST_BEAT, "REDIS_URL": server.url}
    client = redis.Redis.from_url(server.url)
    try:
        with ExitStack() as stack:
            a = stack.enter_context(celery_beat(tmp_path, "a", **env))
            wait_for(lambda: holder_pid(client) == a.pid, 60, what=f"beat a to take the lock ({a.log.read_text()[-400:]})")
            b = stack.enter_context(celery_beat(tmp_path, "b", **env))
            wait_for(lambda: started(b), 60, what="beat b")
            time.sleep(1.5)
            assert holder_pid(client) == a.pid
            # A clean stop releases the lock: b takes it at its next try, not after the lock expires.
            stopped_at = kill(a, signal.SIGTERM)
            wait_for(lambda: holder_pid(client) == b.pid, LOCK_SECONDS + 5, 0.05, what="b to take the lock")
            handover = time.time() - stopped_at
            assert handover < RENEW_SECONDS + 0.5, handover
            c = stack.enter_context(celery_beat(tmp_path, "c", **env))
            wait_for(lambda: started(c), 60, what="beat c")
            time.sleep(1.5)

            # Redis restarts empty: no lock, no last runs. One of the two beats takes the lock again and
            # periodic tasks resume; neither beat process ends.
            server.stop()
            time.sleep(2)
            server.start()
            restarted_at = time.time()
            wait_for(lambda: holder_pid(client) in (b.pid, c.pid), 15, 0.05, what="a beat to take the new lock")
            time.sleep(4)
            messages = sent_messages(client)
            assert b.poll() is None and c.poll() is None, b.log.read_text()[-2000:] + c.log.read_text()[-2000:]
    finally:
        server.stop()
    print(f"handover after SIGTERM: {handover:.2f} s")
    assert len({m["pid"] for m in messages}) == 1
    times = [m["at"] for m in messages if m["task"] == "jobs.recovery_advance"]
    assert times and times[0] - restarted_at < LOCK_SECONDS + RENEW_SECONDS + 1.0
    assert len(times) >= 3 and min(gaps(times)) > 0.8, gaps(times)
