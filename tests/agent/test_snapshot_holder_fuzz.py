"""A bounded property-based fuzz of the snapshot holder's wire protocol, against a real holder process.

Random, truncated and oversized frames; valid frames with random field values (ops, sequence numbers, job and slot
names, sizes, metadata, keys); zero, one or two descriptors of every kind (memfds of any size, pipes, files); on
unbound connections and on connections bound to a job of the fuzzer's own. Whatever comes, the holder answers each
frame with a JSON object or closes the connection, never dies or hangs, and never lets anything of another job
out or changes it: the victim job's slot, its bytes and its metadata stay as they were, and no descriptor of it
is ever handed out. 200 examples, each on a connection of its own; about 20 seconds.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lockstep_agent.snapshot_holder import (
    MAX_FRAME,
    TAG_BYTES,
    HolderClient,
    make_slot_fd,
    request_tag,
)

pytestmark = pytest.mark.slow

VICTIM_JOB, VICTIM_SLOT, VICTIM_MARK = "victim", "own/0/0", "victim-meta-marker-5f1c"
VICTIM_BYTES = b"victim-bytes-" + bytes(range(32))
FUZZ_KEY = bytes(range(32))


@pytest.fixture(scope="module")
def holder(tmp_path_factory):
    """A real holder (small caps, so the fuzzer reaches them) with the victim job's one committed slot."""
    folder = tmp_path_factory.mktemp("fuzz")
    path = str(folder / "holder.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "lockstep_agent.snapshot_holder", "--socket", path]
        + ["--max-job-slots", "8", "--max-job-bytes", "8M", "--max-bytes", "16M", "--max-jobs", "8"],
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "holder.log", "w"),
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            HolderClient(path, timeout=2).ping()
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "the holder did not start"
            time.sleep(0.05)
    victim = HolderClient(path, job=VICTIM_JOB, key=os.urandom(32))
    fd = make_slot_fd("victim", 4096)
    os.pwrite(fd, VICTIM_BYTES, 0)
    victim.register(VICTIM_SLOT, fd, 4096)
    identity = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    os.close(fd)
    victim.commit(VICTIM_SLOT, {"iteration": 5, "mark": VICTIM_MARK, "nbytes": len(VICTIM_BYTES)})
    yield {"path": path, "process": process, "victim": victim, "identity": identity, "listed": victim.list()}
    process.kill()
    process.wait(10)


# --- what the fuzzer sends ------------------------------------------------------------------------------------------
json_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
names = st.sampled_from(
    [VICTIM_SLOT, "own/0/1", "replica/1/0", "", "/", "../x", "a" * 300, VICTIM_JOB]
) | st.text(max_size=30)
ops = st.sampled_from(
    ["bind", "register", "begin", "commit", "open", "list", "drop", "stats", "ping"]
) | st.text(max_size=10)
sizes = st.sampled_from([0, 1, 4096, 2**60, -1, 2**63, 1.5, "4096", None, True]) | st.integers(
    -(2**64), 2**64
)
request = st.fixed_dictionaries(
    {"op": ops},
    optional={
        "seq": st.sampled_from(["next"])
        | st.integers(-5, 2**64)
        | st.none()
        | st.booleans()
        | st.text(max_size=5),
        "job": st.sampled_from([VICTIM_JOB, "fuzz"]) | st.text(max_size=20) | st.integers(),
        "name": names,
        "size": sizes,
        "meta": json_value,
        "prefix": names,
        "after": names,
        "above": sizes,
        "key": st.sampled_from([FUZZ_KEY.hex(), "00" * 32, "zz"]) | st.text(max_size=70),
        "extra": json_value,
    },
)
# Requests a client of the protocol would send (its own job, the next sequence number), with values at and past
# the edges: these reach past the authentication into what each operation does.
plausible = st.fixed_dictionaries(
    {
        "op": st.sampled_from(
            ["register", "begin", "commit", "open", "list", "drop", "stats", "ping", "bind"]
        ),
        "seq": st.just("next"),
        "job": st.just("fuzz"),
    },
    optional={
        "name": st.sampled_from(["own/0/0", "own/0/1", "replica/1/0", VICTIM_SLOT, ""]) | names,
        "size": st.sampled_from([10, 4096, 2**50, 2**60, 4097]) | sizes,
        "meta": st.fixed_dictionaries(
            {},
            optional={"iteration": st.integers(-2, 10), "nbytes": st.sampled_from([0, 10, 4096, 4097, -1])},
        )
        | json_value,
        "prefix": st.sampled_from(["", "own/", "victim", "own/0/0"]) | names,
        "above": st.sampled_from([None, -1, 3]) | sizes,
        "after": st.sampled_from(["", "own/0/0"]) | names,
    },
)
one_descriptor = st.sampled_from(["memfd-small", "memfd-4096", "memfd-huge", "pipe", "file", "unsealable"])
descriptors = (
    st.just([])
    | st.just([])
    | st.lists(one_descriptor, min_size=1, max_size=1)
    | st.lists(one_descriptor, min_size=2, max_size=2)
)
frame = st.one_of(
    st.tuples(st.just("raw"), st.binary(max_size=200), descriptors),
    st.tuples(st.just("oversized"), st.integers(MAX_FRAME - 8, MAX_FRAME + 4096), descriptors),
    st.tuples(
        st.just("request"), st.tuples(st.sampled_from(["signed", "zeros", "random"]), request), descriptors
    ),
    st.tuples(st.just("truncated"), st.tuples(request, st.integers(0, 200)), descriptors),
    st.tuples(st.just("request"), st.tuples(st.just("signed"), plausible), descriptors),
    st.tuples(st.just("request"), st.tuples(st.just("signed"), plausible), descriptors),
    # A registration as a client makes one, its claim right or off (by a byte, by 2**60).
    st.tuples(
        st.just("register"),
        st.tuples(
            st.sampled_from(["own/0/0", "own/0/1", "replica/1/0", VICTIM_SLOT, "own/0/2"]),
            st.sampled_from([0, 0, 0, 1, -1, 2**60]),
        ),
        st.lists(
            st.sampled_from(["memfd-small", "memfd-4096", "memfd-huge", "unsealable"]), min_size=1, max_size=1
        ),
    ),
)
session = st.tuples(st.booleans() | st.just(True), st.lists(frame, min_size=1, max_size=8))


def _descriptor(kind: str, folder: str) -> int:
    if kind.startswith("memfd"):
        size = {"memfd-small": 10, "memfd-4096": 4096, "memfd-huge": 2**50}[kind]
        return make_slot_fd("fuzz", size)
    if kind == "unsealable":
        fd = os.memfd_create("unsealable", os.MFD_CLOEXEC)
        os.ftruncate(fd, 4096)
        return fd
    if kind == "pipe":
        reader, writer = os.pipe()
        os.close(writer)
        return reader
    return os.open(os.path.join(folder, "holder.log"), os.O_RDONLY)


class _Session:
    """One raw connection, speaking (or not) the protocol as the fuzzer says."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(10)
        self.sock.connect(path)
        hello = json.loads(self.sock.recv(MAX_FRAME))
        assert hello["ok"] and hello["protocol"] == 2
        self.nonce, self.seq, self.key, self.closed = bytes.fromhex(hello["nonce"]), 0, None, False

    def bind(self) -> None:
        self.seq += 1
        body = json.dumps({"op": "bind", "job": "fuzz", "key": FUZZ_KEY.hex(), "seq": self.seq}).encode()
        self.sock.send(request_tag(FUZZ_KEY, self.nonce, body) + body)
        assert json.loads(self.sock.recv(MAX_FRAME))["ok"]
        self.key = FUZZ_KEY

    def data(self, kind: str, payload, fd_kinds=()) -> bytes:
        if kind == "raw":
            return payload
        if kind == "oversized":
            return os.urandom(payload)
        if kind == "register":
            name, off = payload
            size = {"memfd-small": 10, "memfd-4096": 4096, "memfd-huge": 2**50, "unsealable": 4096}[
                fd_kinds[0]
            ]
            return self.data(
                "request",
                (
                    "signed",
                    {"op": "register", "job": "fuzz", "name": name, "size": size + off, "seq": "next"},
                ),
            )
        if kind == "truncated":
            message, cut = payload
            return (bytes(TAG_BYTES) + json.dumps(message).encode())[:cut]
        tagging, message = payload
        if message.get("seq") == "next":
            message = {**message, "seq": self.seq + 1}
        body = json.dumps(message).encode()
        if tagging == "signed" and self.key:
            tag = request_tag(self.key, self.nonce, body)
        else:
            tag = bytes(TAG_BYTES) if tagging == "zeros" else os.urandom(TAG_BYTES)
        return tag + body

    def exchange(self, data: bytes, fds: list[int]) -> tuple[bytes, list[int]]:
        """Send one frame; the reply (b'' once the holder closed) and the descriptors that came with it."""
        try:
            if fds:
                socket.send_fds(self.sock, [data], fds)
            else:
                self.sock.send(data)
        except (BrokenPipeError, ConnectionResetError):
            self.closed = True
            return b"", []
        except (
            OSError
        ):  # a frame the kernel will not carry (too large for the socket): not the holder's doing
            return None, []
        reply, received, _flags, _address = socket.recv_fds(self.sock, 1 << 18, 4)
        if not reply:
            self.closed = True
        return reply, list(received)


@settings(
    max_examples=200,
    deadline=5000,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(session=session)
def test_the_holder_survives_any_frame_and_never_leaks_or_changes_another_jobs_slots(holder, session):
    bound, frames = session
    conn = _Session(holder["path"])
    folder = os.path.dirname(holder["path"])
    try:
        if bound:
            conn.bind()
        for kind, payload, fd_kinds in frames:
            data = conn.data(kind, payload, fd_kinds)
            fds = [_descriptor(k, folder) for k in fd_kinds]
            try:
                reply, received = conn.exchange(data, fds)
            finally:
                for fd in fds:
                    os.close(fd)
            try:
                for fd in received:  # no descriptor of the victim's ever comes out
                    seen = os.fstat(fd)
                    assert (seen.st_dev, seen.st_ino) != holder["identity"], (
                        "the victim's memory was handed out"
                    )
            finally:
                for fd in received:
                    os.close(fd)
            if reply is None:
                continue
            if conn.closed:
                break
            answer = json.loads(reply)  # an answer is always a JSON object…
            assert isinstance(answer, dict) and isinstance(answer["ok"], bool), answer
            assert answer["ok"] or isinstance(answer["error"], str)
            assert (
                VICTIM_MARK.encode() not in reply and b"victim-bytes" not in reply
            )  # …that says nothing of it
            if kind == "register" or (kind == "request" and payload[1].get("op") not in ("ping", "bind")):
                # The holder counts every request it authenticated, answered or not; not the ones it refused.
                unproven = ("refused:", "a frame is", "the request is not")
                if answer["ok"] or not answer["error"].startswith(unproven):
                    conn.seq += 1
    finally:
        conn.sock.close()
    # The holder lives, and the victim's slot is as it was.
    assert holder["process"].poll() is None
    victim = holder["victim"]
    assert victim.list() == holder["listed"]
    fd, size, meta = victim.open(VICTIM_SLOT)
    try:
        assert (
            os.pread(fd, len(VICTIM_BYTES), 0) == VICTIM_BYTES
            and size == 4096
            and meta["mark"] == VICTIM_MARK
        )
    finally:
        os.close(fd)
