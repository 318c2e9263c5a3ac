"""The protection runtime's peer channel, attacked as the outside attack did (issue 54, M3), against real holders
and real training processes:

- a process of the same user without the job's secret lists, reads, drops and plants the job's slots: refused,
  the slots intact;
- a process of another user is refused by the kernel's word on who connected (``SO_PEERCRED``);
- sizes a client claims are checked against the memory's (40 slots claiming 2**60 bytes), and the caps hold;
- a planted slot (a pickle that would create a file when unpickled) is refused at restore in a real two-rank
  run, no code runs, and the job restores from its disk checkpoint, saying why;
- a forged or replayed heartbeat in the job's store does not make the watchdog name a rank stalled.

torch is imported inside the tests that train (``importorskip``): collecting this module never needs it.
"""

import json
import os
import pickle
import pwd
import secrets
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest
from lockstep_agent.snapshot_holder import HolderClient, HolderRefused, make_slot_fd

pytestmark = pytest.mark.slow


def _start_holder(folder: str, *flags: str) -> tuple[subprocess.Popen, str]:
    path = os.path.join(folder, "holder.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "lockstep_agent.snapshot_holder", "--socket", path, *flags],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(folder, "holder.log"), "a"),
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            HolderClient(path, timeout=2).ping()
            return process, path
        except OSError:
            assert process.poll() is None, open(os.path.join(folder, "holder.log")).read()
            time.sleep(0.05)
    raise TimeoutError("the holder did not start")


@pytest.fixture
def holder(tmp_path):
    """A real holder with its default settings; yields (process, socket path)."""
    process, path = _start_holder(str(tmp_path))
    yield process, path
    process.kill()
    process.wait(10)


def _victim(path: str) -> tuple[HolderClient, dict]:
    """The job "victim" with one committed slot holding known bytes; returns its client and what it keeps."""
    key = secrets.token_bytes(32)
    client = HolderClient(path, job="victim", key=key)
    fd = make_slot_fd("victim/own/0/0", 4096)
    os.pwrite(fd, b"the victim's weights", 0)
    client.register("own/0/0", fd, 4096)
    os.close(fd)
    client.commit("own/0/0", {"owner": 0, "iteration": 7, "nbytes": 20})
    return client, {"key": key, "slots": client.list()}


def _intact(client: HolderClient, before: list) -> None:
    assert client.list() == before
    fd, size, meta = client.open("own/0/0")
    try:
        assert os.pread(fd, 20, 0) == b"the victim's weights" and size == 4096 and meta["iteration"] == 7
    finally:
        os.close(fd)


ATTACKER = textwrap.dedent("""
    import json, os, socket, sys
    from lockstep_agent.snapshot_holder import HolderClient, HolderRefused, make_slot_fd, TAG_BYTES
    path = sys.argv[1]
    results = {}

    def attempt(name, action):
        try:
            action()
            results[name] = "done"
        except (HolderRefused, PermissionError) as error:
            results[name] = "refused: " + str(error)

    # Unbound: the client cannot even ask; a hand-made frame with an empty tag neither.
    unbound = HolderClient(path)
    attempt("list", lambda: unbound.list())
    attempt("open", lambda: unbound.open("own/0/0"))
    attempt("drop", lambda: unbound.drop())
    attempt("register", lambda: unbound.register("own/0/0", make_slot_fd("x", 4096), 4096))
    for op in ("list", "open", "drop", "commit"):
        frame = bytes(TAG_BYTES) + json.dumps(
            {"op": op, "seq": unbound.seq + 1, "job": "victim", "name": "own/0/0", "meta": {}}
        ).encode()
        unbound.sock.send(frame)
        results["raw " + op] = json.loads(unbound.sock.recv(1 << 16))
    # Binding the victim's job with a guessed key.
    attempt("bind victim", lambda: HolderClient(path, job="victim", key=os.urandom(32)))
    # Its own job, then the victim's slots by name and by prefix.
    own = HolderClient(path, job="attacker", key=os.urandom(32))
    results["own list"] = own.list()
    attempt("own open victim", lambda: own.open("own/0/0"))
    attempt("own commit victim", lambda: own.commit("own/0/0", {"iteration": 99}))
    results["own drop"] = own.drop()
    # A signed request replayed with another sequence number (the holder counts).
    own.seq -= 1
    attempt("replay", lambda: own.list())
    print(json.dumps(results))
""")


def test_a_process_without_the_jobs_secret_cannot_list_read_drop_or_plant_its_slots(holder, tmp_path):
    _, path = holder
    client, victim = _victim(path)
    run = subprocess.run(
        [sys.executable, "-c", ATTACKER, path], capture_output=True, text=True, timeout=60, check=True
    )
    results = json.loads(run.stdout)
    for name in ("list", "open", "drop", "register"):
        assert results[name].startswith("refused:") and "bind a job" in results[name], (name, results[name])
    for op in ("list", "open", "drop", "commit"):
        assert results[f"raw {op}"]["ok"] is False and "bind a job" in results[f"raw {op}"]["error"]
    assert "belongs to another key or user" in results["bind victim"]
    assert results["own list"] == [] and results["own drop"] == 0  # its own job sees nothing of the victim's
    assert "no slot" in results["own open victim"] and "no slot" in results["own commit victim"]
    assert "out of sequence" in results["replay"]
    _intact(client, victim["slots"])


def _as_nobody(action) -> str:
    """Run ``action`` in a forked child that became ``nobody``; returns what it printed."""
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            out = action()
        except BaseException as error:
            out = f"{type(error).__name__}: {error}"
        os.write(write, str(out).encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        out = pipe.read()
    os.waitpid(child, 0)
    return out


def test_another_user_is_refused_by_peer_credentials_and_an_allowed_one_only_reaches_its_own_jobs():
    if os.geteuid() != 0:
        pytest.skip("becoming another user needs root")
    folder = tempfile.mkdtemp(prefix="lockstep-peercred-")
    os.chmod(folder, 0o711)  # the socket's folder and mode let anyone connect: only SO_PEERCRED stands
    try:
        process, path = _start_holder(folder, "--socket-mode", "666")
        try:
            client, victim = _victim(path)
            assert oct(os.stat(path).st_mode & 0o777) == "0o666"
            out = _as_nobody(lambda: HolderClient(path).ping())
            assert (
                out.startswith("PermissionError") and f"uid {pwd.getpwnam('nobody').pw_uid} may not" in out
            ), out
            _intact(client, victim["slots"])
        finally:
            process.kill()
            process.wait(10)
        # A holder that serves nobody too: nobody binds a job of its own, never root's, even with root's key.
        process, path = _start_holder(folder, "--allow-uid", str(pwd.getpwnam("nobody").pw_uid))
        try:
            client, victim = _victim(path)

            def nobody_tries():
                own = HolderClient(path, job="nobodys", key=os.urandom(32))
                own.register("own/0/0", make_slot_fd("n", 4096), 4096)
                try:
                    HolderClient(path, job="victim", key=victim["key"])
                    return f"own {len(own.list())}; victim bound"
                except HolderRefused as error:
                    return f"own {len(own.list())}; {error}"

            out = _as_nobody(nobody_tries)
            assert out.startswith("own 1; ") and "belongs to another key or user" in out, out
            _intact(client, victim["slots"])
        finally:
            process.kill()
            process.wait(10)
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_claimed_sizes_are_the_memorys_and_the_caps_hold(tmp_path):
    process, path = _start_holder(
        str(tmp_path),
        "--max-job-slots",
        "4",
        "--max-job-bytes",
        "1M",
        "--max-bytes",
        "1536K",
        "--max-jobs",
        "2",
    )
    try:
        client = HolderClient(path, job="greedy", key=os.urandom(32))
        # The attack as reported: 40 slots claiming 2**60 bytes each. A small memfd claiming it: refused.
        for i in range(40):
            fd = make_slot_fd("small", 4096)
            with pytest.raises(HolderRefused, match="claims 1152921504606846976 bytes; its memory has 4096"):
                client.register(f"own/0/{i}", fd, 2**60)
            os.close(fd)
        # A memfd really that large (sparse): over the cap. And a claim one byte off: refused.
        huge = make_slot_fd("huge", 2**60)
        with pytest.raises(HolderRefused, match="over the cap"):
            client.register("own/0/0", huge, 2**60)
        os.ftruncate(huge, 4096)  # a refused registration leaves the memfd as it was (unsealed)
        with pytest.raises(HolderRefused, match="claims 4097 bytes; its memory has 4096"):
            client.register("own/0/0", huge, 4097)
        # Not a memfd: a regular file, a pipe.
        with open(tmp_path / "file", "wb") as handle:
            handle.truncate(4096)
            with pytest.raises(HolderRefused, match="must be a memfd"):
                client.register("own/0/0", handle.fileno(), 4096)
        reader, writer = os.pipe()
        with pytest.raises(HolderRefused, match="must be a memfd"):
            client.register("own/0/0", reader, 4096)
        assert client.stats()["slots"] == 0 and client.stats()["bytes"] == 0
        # Caps: 4 slots, 1 MiB per job; 1.5 MiB in all; 2 jobs.
        for i in range(4):
            client.register(f"own/0/{i}", make_slot_fd("s", 4096), 4096)
        with pytest.raises(HolderRefused, match="at most 4 slots"):
            client.register("own/0/4", make_slot_fd("s", 4096), 4096)
        client.register("own/0/0", make_slot_fd("s", 900 << 10), 900 << 10)  # replacing a slot: fine
        with pytest.raises(HolderRefused, match="at most 1048576"):
            client.register("own/0/1", make_slot_fd("s", 200 << 10), 200 << 10)
        other = HolderClient(path, job="other", key=os.urandom(32))
        with pytest.raises(HolderRefused, match="holder keeps at most 1572864 bytes"):
            other.register("own/0/0", make_slot_fd("s", 700 << 10), 700 << 10)
        with pytest.raises(HolderRefused, match="keeps 2 jobs already"):
            HolderClient(path, job="third", key=os.urandom(32))
        # A slot's sealed size stays: its writer cannot grow it past the caps afterwards.
        fd, size, _ = client.open("own/0/0")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 2**40)
        os.close(fd)
        # What a commit claims of a slot is checked too.
        with pytest.raises(HolderRefused, match="nbytes must be an integer from 0"):
            client.commit("own/0/0", {"nbytes": (900 << 10) + 1})
        stats = client.stats()
        assert stats["slots"] == 4 and stats["bytes"] == (900 << 10) + 3 * 4096
        assert process.poll() is None
    finally:
        process.kill()
        process.wait(10)


# --- a real two-rank run ---------------------------------------------------------------------------------------------
@pytest.fixture
def harness():
    pytest.importorskip("torch")
    from lockstep_agent.protect import testing

    yield testing
    testing.kill_all()


def _run(nodes, harness, folder, args, env, tag, timeout=180) -> list[dict]:
    """Launch every rank and wait for them to finish; returns the launch's events."""
    harness.launch(nodes, folder, args, env=env, tag=tag)
    for node in nodes:
        node.trainer.wait(timeout)
        assert node.trainer.returncode == 0, open(node.logs[-1].replace(".jsonl", ".stderr")).read()[-3000:]
    return [e for node in nodes for e in harness.events(node.logs[-1])]


class _Exploit:
    """Unpickled, it creates the file at ``path``: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _old_format_pickle(marker: str, size: int) -> bytes:
    """A slot as the runtime before this change wrote one (LSPROT01: a header, then a pickled skeleton), whose
    skeleton runs code when unpickled."""
    skeleton = pickle.dumps({"model": _Exploit(marker)})
    head = struct.pack("<8sqqq", b"LSPROT01", len(skeleton), 99, size)
    return (head + skeleton).ljust(size, b"\0")


def test_a_planted_slot_is_refused_at_restore_no_code_runs_and_the_job_restores_from_disk(tmp_path, harness):
    from lockstep_agent.protect import keys
    from lockstep_agent.protect import state as packing

    folder, job, secret = str(tmp_path), "planted", secrets.token_hex(32)
    marker = str(tmp_path / "code-ran")
    # The plant is live: unpickled, it creates its file.
    pickle.loads(_old_format_pickle(str(tmp_path / "live"), 4096)[32:])
    assert os.path.exists(tmp_path / "live")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_PROTECT_SECRET"] = secret
    checkpoints = os.path.join(folder, "checkpoints")
    args = [
        "--every",
        "1",
        "--batch",
        "256",
        "--job",
        job,
        "--checkpoint-dir",
        checkpoints,
        "--disk-every",
        "4",
    ]
    nodes = [harness.start_node(folder, f"node{i}", env) for i in range(2)]
    _run(nodes, harness, folder, [*args, "--iterations", "10"], env, "-0")

    # The attacker has the job's holder key (say it impersonated the holder), never its snapshot key: it plants
    # iteration 99 for both ranks — an old-format pickle and a new-format slot sealed with a key of its own.
    holder_key = keys.derive(keys.root(secret.encode()), job).holder
    attacker_key = os.urandom(32)

    def plant(node, name: str, owner: int, payload: bytes) -> None:
        client = HolderClient(node.socket_path, job=job, key=holder_key)
        fd = make_slot_fd("planted", len(payload))
        os.pwrite(fd, payload, 0)
        client.register(name, fd, len(payload))
        os.close(fd)
        kind = name.split("/")[0]
        client.commit(
            name, {"owner": owner, "iteration": 99, "nbytes": len(payload), "kind": kind, "world": 2}
        )
        client.close()

    def forged(owner: int) -> bytes:
        return packing.Packed({"iteration": 99, "model": {}}, 99, owner=owner, world=2).to_bytes(attacker_key)

    def plant_all() -> None:
        plant(nodes[0], "own/0/7", 0, _old_format_pickle(marker, 4096))
        plant(nodes[0], "replica/1/7", 1, forged(1))
        plant(nodes[1], "own/1/7", 1, forged(1))
        plant(nodes[1], "replica/0/7", 0, _old_format_pickle(marker, 4096))

    # 1. Planted beside the job's own copies: every planted copy refused, the real iteration 10 restored.
    plant_all()
    starts = [
        e
        for e in _run(nodes, harness, folder, [*args, "--iterations", "12"], env, "-1")
        if e["event"] == "start"
    ]
    assert {(s["kind"], s["iteration"]) for s in starts} == {("snapshot", 10)}, starts
    assert not os.path.exists(marker)

    # 2. The job's copies dropped and only planted ones left: refused, and the disk checkpoint (12) restored.
    for node in nodes:
        HolderClient(node.socket_path, job=job, key=holder_key).drop()
    plant_all()
    starts = [
        e
        for e in _run(nodes, harness, folder, [*args, "--iterations", "14"], env, "-2")
        if e["event"] == "start"
    ]
    assert {(s["kind"], s["iteration"]) for s in starts} == {("disk_fallback", 12)}, starts
    reason = starts[0]["reason"]
    assert "4 copies refused" in reason, reason
    assert "older, unauthenticated format" in reason and "tag is wrong" in reason, reason
    stderr = open(nodes[0].logs[-1].replace(".jsonl", ".stderr")).read()
    assert "fell back to the disk checkpoint at iteration 12" in stderr and "refused" in stderr
    assert not os.path.exists(marker)  # nothing was unpickled, anywhere
    for node in nodes:
        node.kill()


def test_a_forged_or_replayed_heartbeat_does_not_make_the_watchdog_name_a_rank(tmp_path, harness):
    import datetime

    import torch.distributed as dist

    folder, job = str(tmp_path), "beats"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_PROTECT_SECRET"] = secrets.token_hex(32)
    args = ["--iterations", "10", "--every", "1", "--batch", "256", "--job", job, "--ddp"]
    args += ["--stall-rank", "1", "--stall-at", "7", "--stall-seconds", "40"]
    args += ["--hang-factor", "4", "--hang-min-seconds", "4"]
    nodes = [harness.start_node(folder, f"node{i}", env) for i in range(3)]
    port = harness.launch(nodes, folder, args, env=env, tag="-0")

    def events():
        return [e for node in nodes for e in harness.events(node.logs[-1])]

    def wait(predicate, what, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise TimeoutError(what)

    # Whoever reaches the job's store reads the heartbeats…
    wait(lambda: any(e["event"] == "step" and e["iteration"] >= 2 for e in events()), "iteration 2")
    store = dist.PrefixStore(
        f"lockstep-protect/{job}/",
        dist.TCPStore("127.0.0.1", int(port), is_master=False, timeout=datetime.timedelta(seconds=20)),
    )
    old = store.get("beat/0")
    # …and, once rank 1 stalls and the others wait for it in the gradient sync, writes: rank 2 forged far behind
    # (the format before this change, then a wrong tag), rank 0 replayed from iteration 2.
    wait(lambda: any(e["event"] == "stalling" for e in events()), "the stall")
    time.sleep(1.0)
    store.set("beat/2", f"1:done:{time.time():.3f}")
    store.set("beat/2", f"1:done:{time.time():.3f}:3:{'0' * 32}")
    store.set("beat/0", old)
    wait(lambda: {e["rank"] for e in events() if e["event"] == "hang"} == {0, 1, 2}, "a hang on every rank")
    hangs = {e["rank"]: e for e in events() if e["event"] == "hang"}
    for node in nodes:
        node.kill()
    # Ranks 0 and 2 (waiting in the sync) still name rank 1, and only rank 1; rank 1, which believes neither
    # heartbeat, names nobody rather than whom the forger chose.
    assert hangs[0]["stalled_ranks"] == [1] and hangs[2]["stalled_ranks"] == [1], hangs
    assert hangs[1]["stalled_ranks"] == [], hangs[1]
    assert hangs[0]["unverified_ranks"] == [2] and hangs[2]["unverified_ranks"] == [0]
    assert hangs[1]["unverified_ranks"] == [0, 2]
    assert "not believed" in hangs[0]["detail"] and "rank(s) 1 did not reach" in hangs[0]["detail"]
