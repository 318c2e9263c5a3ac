"""The per-node snapshot holder: a small process that keeps shared-memory slots alive across training restarts.

A training process creates each slot as an anonymous shared-memory file (``memfd_create``), maps it, and hands
the file descriptor to its node's holder over a Unix ``SOCK_SEQPACKET`` socket (``SCM_RIGHTS``). The holder
keeps the descriptor open, so the memory outlives the training process; a relaunched process asks for it back
and maps it again. Nothing is copied through the holder: it only keeps descriptors and each slot's metadata
(whose state, which iteration, how many bytes, and whether the slot is complete). When the holder dies with
its node, the kernel frees the memory: a node lost is its copies lost.

Who may do what (protocol 2):

- **Peers**: the kernel says who connected (``SO_PEERCRED``); only the holder's own user is served unless
  ``--allow-uid`` names others (or ``any``). Each job's slots are bound to the user that first bound the job.
- **Jobs**: a connection binds one job with the job's holder key (derived from the job's secret,
  ``lockstep_agent.protect.keys``); the first binding of a job name sets its key, later ones must bring the same.
  Every later request carries a sequence number and an HMAC-SHA256 under that key over the connection's nonce and
  the request, checked before the request is read. A request without it, or for another job, is refused and
  changes nothing. A connection sees and touches its own job's slots only.
- **Sizes**: a slot's descriptor must be a memfd; the holder seals its size (``F_SEAL_GROW | F_SEAL_SHRINK``) and
  refuses a registration whose claimed size is not the memfd's real size (``fstat``), or that would take the job
  past ``--max-job-slots`` slots or ``--max-job-bytes`` bytes, or the holder past ``--max-bytes`` or ``--max-jobs``.

Frame: one message per request, a 32-byte tag then a JSON object (``op``, ``seq``, ``job`` and the op's fields);
at most ``MAX_FRAME`` bytes and one descriptor. The holder greets each connection with
``{"ok": true, "protocol": 2, "nonce": …, "uid": …}`` and answers each request with a JSON object (``ok``, then
the answer or ``error``), the descriptor of ``open`` attached.

Run one per node, before the training processes: ``python -m lockstep_agent.snapshot_holder --socket PATH``
(it imports nothing but the standard library, so it starts in milliseconds and needs no torch).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import signal
import socket
import stat
import struct
import threading
from dataclasses import dataclass, field

log = logging.getLogger("lockstep_agent.snapshot_holder")

PROTOCOL = 2
MAX_FRAME = 64 << 10
MAX_REPLY = 256 << 10
MAX_META = 512
LIST_PAGE = 64
TAG_BYTES = 32
KEY_BYTES = 32
_TAG_PREFIX = b"lockstep-holder/2\0"
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")
SLOT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}(/[A-Za-z0-9._-]{1,64}){0,7}")
_SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class HolderRefused(RuntimeError):
    """The holder refused a request (``error`` says why); nothing changed."""


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_bytes(text: str | int) -> int:
    """``123``, ``64M``, ``2G``, ``1T`` (powers of 1024) or ``50%`` (of this node's physical memory)."""
    value = str(text).strip().upper().removesuffix("B")
    if value.endswith("%"):
        return int(physical_memory() * float(value[:-1]) / 100)
    for power, suffix in enumerate("KMGT", start=1):
        if value.endswith(suffix):
            return int(float(value[:-1]) * 1024**power)
    return int(value)


@dataclass
class Limits:
    """What one holder allows (each with its flag and environment variable; see ``main``)."""

    max_job_slots: int = 256
    max_job_bytes: int = field(default_factory=lambda: physical_memory() // 2)
    max_bytes: int = field(default_factory=lambda: physical_memory() * 3 // 4)
    max_jobs: int = 256
    max_connections: int = 1024
    # The peers' uids the holder serves: None for any; by default only its own.
    allow_uids: frozenset[int] | None = field(default_factory=lambda: frozenset({os.geteuid()}))


# --- frames -----------------------------------------------------------------------------------------------------------
def request_tag(key: bytes, nonce: bytes, body: bytes) -> bytes:
    return hmac.new(key, _TAG_PREFIX + nonce + body, hashlib.sha256).digest()


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _receive(sock: socket.socket, limit: int = MAX_FRAME) -> tuple[bytes, list[int], int]:
    data, fds, flags, _address = socket.recv_fds(sock, limit, 1)
    return data, list(fds), flags


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded them at connect."""
    return _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the holder's state -------------------------------------------------------------------------------------------------
@dataclass
class _Slot:
    fd: int
    size: int
    meta: dict | None = None  # None while being written


@dataclass
class _Job:
    name: str
    key: bytes
    uid: int
    slots: dict[str, _Slot] = field(default_factory=dict)
    connections: int = 0

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.slots.values())


@dataclass
class _Connection:
    pid: int
    uid: int
    nonce: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    seq: int = 0
    job: _Job | None = None


class Holder:
    """The slots of one node, by job and by slot name (``own/<rank>/<n>``, ``replica/<owner>/<n>``)."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.jobs: dict[str, _Job] = {}
        self.lock = threading.Lock()
        self.refused = 0  # requests refused for want of proof (unbound, wrong tag, out of sequence)

    def allowed(self, uid: int) -> bool:
        return self.limits.allow_uids is None or uid in self.limits.allow_uids

    @property
    def bytes(self) -> int:
        return sum(job.bytes for job in self.jobs.values())

    # A frame in, a reply (and descriptors of its own, which the caller closes once sent) out. Never raises; a
    # refused request changes nothing. The descriptors that came with the frame are kept only by a registration.
    def frame(self, conn: _Connection, data: bytes, fds: list[int]) -> tuple[dict, list[int]]:
        kept = False
        try:
            reply, out = self._frame(conn, data, fds)
            kept = bool(reply.get("ok")) and reply.get("registered") is True
        except Exception as error:  # a bug must not take the node's snapshots with it
            log.exception("request from pid %d failed", conn.pid)
            reply, out = {"ok": False, "error": f"internal error: {type(error).__name__}"}, []
        if not kept:
            _close_all(fds)
        return reply, out

    def _frame(self, conn: _Connection, data: bytes, fds: list[int]) -> tuple[dict, list[int]]:
        if len(data) < TAG_BYTES + 2:
            return {"ok": False, "error": "a frame is a 32-byte tag and a JSON object"}, []
        tag, body = data[:TAG_BYTES], data[TAG_BYTES:]
        if conn.job is not None:
            # Checked before the request is read: nothing of an unproven request is parsed.
            if not hmac.compare_digest(tag, request_tag(conn.job.key, conn.nonce, body)):
                return self._unproven(conn, "the request's tag is wrong (not signed with this job's key)")
        request = _parse(body)
        if request is None:
            return {"ok": False, "error": "the request is not a JSON object"}, []
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "protocol": PROTOCOL}, []
        if conn.job is None and op != "bind":
            return self._unproven(conn, "bind a job (with its key) before anything else")
        if request.get("seq") != conn.seq + 1 or not _is_int(request.get("seq")):
            return self._unproven(conn, f"out of sequence: expected seq {conn.seq + 1}")
        if op == "bind":
            return self._bind(conn, request, tag, body)
        if request.get("job") != conn.job.name:
            return self._unproven(conn, "this connection is bound to another job")
        conn.seq += 1
        with self.lock:
            return self._job_request(conn.job, op, request, fds)

    def _unproven(self, conn: _Connection, error: str) -> tuple[dict, list[int]]:
        self.refused += 1
        log.warning("refused a request from pid %d uid %d: %s", conn.pid, conn.uid, error)
        return {"ok": False, "error": f"refused: {error}"}, []

    def _bind(self, conn: _Connection, request: dict, tag: bytes, body: bytes) -> tuple[dict, list[int]]:
        name, key_hex = request.get("job"), request.get("key")
        if conn.job is not None:
            return {"ok": False, "error": f"this connection is already bound to job {conn.job.name}"}, []
        if not (isinstance(name, str) and JOB_NAME.fullmatch(name)):
            return {"ok": False, "error": "a job name is 1-128 letters, digits and ._:@+=-"}, []
        try:
            key = bytes.fromhex(key_hex) if isinstance(key_hex, str) else b""
        except ValueError:
            key = b""
        if len(key) != KEY_BYTES:
            return {"ok": False, "error": "a job key is 32 bytes, in hex"}, []
        if not hmac.compare_digest(tag, request_tag(key, conn.nonce, body)):
            return self._unproven(conn, "the bind's tag is wrong")
        with self.lock:
            job = self.jobs.get(name)
            if job is not None and (job.uid != conn.uid or not hmac.compare_digest(job.key, key)):
                return self._unproven(conn, f"job {name} belongs to another key or user")
            if job is None:
                if len(self.jobs) >= self.limits.max_jobs:
                    return {"ok": False, "error": f"the holder keeps {self.limits.max_jobs} jobs already"}, []
                job = self.jobs[name] = _Job(name, key, conn.uid)
            job.connections += 1
            conn.job = job
        conn.seq += 1
        return {"ok": True, "job": name}, []

    def release(self, conn: _Connection) -> None:
        """A connection closed: forget its job when nothing else holds it (no slot, no connection)."""
        with self.lock:
            job, conn.job = conn.job, None
            if job is not None:
                job.connections -= 1
                self._forget_if_empty(job)

    def _forget_if_empty(self, job: _Job) -> None:
        if not job.slots and job.connections <= 0 and self.jobs.get(job.name) is job:
            del self.jobs[job.name]

    def _job_request(self, job: _Job, op, request: dict, fds: list[int]) -> tuple[dict, list[int]]:
        if op == "register":
            return self._register(job, request, fds)
        if fds:
            return {"ok": False, "error": f"{op!r} takes no descriptor"}, []
        if op in ("begin", "commit", "open"):
            name = request.get("name")
            slot = job.slots.get(name) if isinstance(name, str) else None
            if slot is None:
                return {"ok": False, "error": f"no slot {str(name)[:200]!r}"}, []
            if op == "begin":  # being overwritten: not a restore point until committed
                slot.meta = None
                return {"ok": True}, []
            if op == "commit":
                meta, error = _checked_meta(request.get("meta"), slot.size)
                if error:
                    return {"ok": False, "error": error}, []
                slot.meta = meta
                return {"ok": True}, []
            # A duplicate, sent after the lock is let go: the slot's own descriptor may be closed by then.
            return {"ok": True, "size": slot.size, "meta": slot.meta}, [os.dup(slot.fd)]
        if op == "list":  # a page of LIST_PAGE slots at a time, by name, after "after"
            prefix, after = request.get("prefix", ""), request.get("after", "")
            if not (isinstance(prefix, str) and isinstance(after, str)):
                return {"ok": False, "error": "prefix and after are strings"}, []
            names = sorted(n for n in job.slots if n.startswith(prefix) and n > after)
            page = names[:LIST_PAGE]
            return {
                "ok": True,
                "slots": [{"name": n, "size": job.slots[n].size, "meta": job.slots[n].meta} for n in page],
                "more": len(names) > len(page),
            }, []
        if op == "drop":  # forget slots under prefix, all or only those newer than "above"
            prefix, above = request.get("prefix", ""), request.get("above")
            if not isinstance(prefix, str) or not (above is None or _is_int(above)):
                return {"ok": False, "error": "prefix is a string, above an integer or null"}, []
            dropped = 0
            for name in [n for n in job.slots if n.startswith(prefix)]:
                meta = job.slots[name].meta
                if above is None or meta is None or _iteration(meta) > above:
                    os.close(job.slots.pop(name).fd)
                    dropped += 1
            return {"ok": True, "dropped": dropped}, []
        if op == "stats":
            return {
                "ok": True,
                "slots": len(job.slots),
                "bytes": job.bytes,
                "max_job_slots": self.limits.max_job_slots,
                "max_job_bytes": self.limits.max_job_bytes,
            }, []
        return {"ok": False, "error": f"unknown operation {str(op)[:40]!r}"}, []

    def _register(self, job: _Job, request: dict, fds: list[int]) -> tuple[dict, list[int]]:
        """A new (or larger) slot: keep its descriptor, once its size is sealed, checked and within the caps."""
        name, size = request.get("name"), request.get("size")
        if not (isinstance(name, str) and len(name) <= 200 and SLOT_NAME.fullmatch(name)):
            return {
                "ok": False,
                "error": "a slot name is up to 8 parts of letters, digits and ._- joined by /",
            }, []
        if not (_is_int(size) and size > 0):
            return {"ok": False, "error": "size is a positive integer"}, []
        if len(fds) != 1:
            return {"ok": False, "error": "register needs exactly one descriptor"}, []
        fd = fds[0]
        if not _is_memfd(fd):
            return {"ok": False, "error": "a slot's descriptor must be a memfd"}, []
        real = os.fstat(fd).st_size
        if real != size:
            return {"ok": False, "error": f"the slot claims {size} bytes; its memory has {real}"}, []
        old = job.slots.get(name)
        slots = len(job.slots) + (0 if old else 1)
        job_bytes = job.bytes - (old.size if old else 0) + size
        total = self.bytes - (old.size if old else 0) + size
        limits = self.limits
        if slots > limits.max_job_slots:
            return {
                "ok": False,
                "error": f"over the cap: a job keeps at most {limits.max_job_slots} slots",
            }, []
        if job_bytes > limits.max_job_bytes:
            return {
                "ok": False,
                "error": f"over the cap: {job_bytes} bytes for this job, at most {limits.max_job_bytes}",
            }, []
        if total > limits.max_bytes:
            return {
                "ok": False,
                "error": f"over the cap: the holder keeps at most {limits.max_bytes} bytes",
            }, []
        # Sealed last, so that a refused registration leaves the caller's memfd as it was; its size is checked
        # again once it can no longer change.
        error = _seal_size(fd)
        if error:
            return {"ok": False, "error": error}, []
        if os.fstat(fd).st_size != size:
            return {"ok": False, "error": "the slot's size changed while it was registered"}, []
        if old:
            os.close(old.fd)
        job.slots[name] = _Slot(fd, size)
        return {"ok": True, "registered": True}, []


def _is_memfd(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    except OSError:
        return False


def _seal_size(fd: int) -> str:
    """Seal a memfd's size (it may not grow or shrink any more); an error message when it cannot be."""
    try:
        if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _SEALS != _SEALS:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError as error:
        return f"a slot's memfd must allow sealing (MFD_ALLOW_SEALING): {error.strerror}"
    return ""


def _checked_meta(meta, size: int) -> tuple[dict | None, str]:
    if not isinstance(meta, dict):
        return None, "meta is a JSON object"
    if len(json.dumps(meta)) > MAX_META:
        return None, f"meta is at most {MAX_META} bytes"
    nbytes = meta.get("nbytes", 0)
    if not (_is_int(nbytes) and 0 <= nbytes <= size):
        return None, f"meta nbytes must be an integer from 0 to the slot's {size} bytes"
    return meta, ""


def _iteration(meta: dict) -> float:
    value = meta.get("iteration", -1)
    return value if _is_int(value) else -1


def _parse(body: bytes) -> dict | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# --- the server -----------------------------------------------------------------------------------------------------
def _serve_connection(sock: socket.socket, holder: Holder, stop: threading.Event) -> None:
    """One peer's connection: its credentials checked, then its frames answered until it closes."""
    with sock:
        try:
            pid, uid, _gid = peer_credentials(sock)
            if not holder.allowed(uid):
                log.warning("refused a connection from pid %d: uid %d is not served", pid, uid)
                _send(sock, {"ok": False, "error": f"refused: uid {uid} may not use this holder"})
                return
            conn = _Connection(pid, uid)
            _send(sock, {"ok": True, "protocol": PROTOCOL, "nonce": conn.nonce.hex(), "uid": os.geteuid()})
        except OSError:
            return
        try:
            while not stop.is_set():
                try:
                    data, fds, flags = _receive(sock)
                except OSError:
                    return
                if not data and not fds:  # the peer closed
                    return
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    _close_all(fds)
                    reply, out = (
                        {"ok": False, "error": f"a frame is at most {MAX_FRAME} bytes and 1 descriptor"},
                        [],
                    )
                else:
                    reply, out = holder.frame(conn, data, fds)
                try:
                    _send(sock, reply, out)
                except OSError:
                    return
                finally:
                    _close_all(out)
        finally:
            holder.release(conn)


def serve(path: str, *, ready=None, limits: Limits | None = None, socket_mode: int | None = None) -> None:
    """Serve the holder at ``path`` until SIGTERM/SIGINT. ``ready`` (an Event) is set once it listens."""
    holder = Holder(limits)
    limits = holder.limits
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    if socket_mode is None:  # a holder that serves other users must let them connect
        socket_mode = 0o600 if limits.allow_uids == frozenset({os.geteuid()}) else 0o666
    os.chmod(path, socket_mode)
    server.listen(64)
    stop = threading.Event()
    open_connections = threading.BoundedSemaphore(limits.max_connections)

    def guarded(sock: socket.socket) -> None:
        try:
            _serve_connection(sock, holder, stop)
        finally:
            open_connections.release()

    def accept() -> None:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                return
            if not open_connections.acquire(blocking=False):
                try:
                    _send(
                        sock,
                        {"ok": False, "error": f"the holder serves {limits.max_connections} connections"},
                    )
                finally:
                    sock.close()
                continue
            threading.Thread(target=guarded, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True, name="holder-accept").start()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    if ready is not None:
        ready.set()
    log.info(
        "snapshot holder %d listening on %s (uids %s; per job %d slots, %d bytes; %d bytes in all)",
        os.getpid(),
        path,
        "any" if limits.allow_uids is None else sorted(limits.allow_uids),
        limits.max_job_slots,
        limits.max_job_bytes,
        limits.max_bytes,
    )
    try:
        stop.wait()
    finally:
        server.close()
        if os.path.exists(path):
            os.unlink(path)


# --- the client -----------------------------------------------------------------------------------------------------
class HolderClient:
    """One connection to the node's holder, bound to one job with its holder key; thread-safe (one request at a
    time). Without ``job`` it can only ``ping``. It talks only to a holder run by root or by this user."""

    def __init__(self, path: str, *, job: str | None = None, key: bytes | None = None, timeout: float = 10.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.lock = threading.Lock()
        self.key: bytes | None = None
        self.job: str | None = None
        self.seq = 0
        try:
            self.sock.connect(path)
            _pid, uid, _gid = peer_credentials(self.sock)
            if uid not in (0, os.geteuid()):
                raise PermissionError(f"the holder at {path} runs as uid {uid}, neither root nor this user")
            hello = _parse(_receive(self.sock)[0] or b"null")
            if hello is None:
                raise ConnectionError(f"the holder at {path} closed the connection")
            if not hello.get("ok"):
                raise PermissionError(f"holder at {path}: {hello.get('error')}")
            if hello.get("protocol") != PROTOCOL:
                raise ConnectionError(
                    f"the holder at {path} speaks protocol {hello.get('protocol')}, not {PROTOCOL}"
                )
            self.nonce = bytes.fromhex(hello["nonce"])
            if job is not None:
                if key is None or len(key) != KEY_BYTES:
                    raise ValueError("binding a job needs its 32-byte holder key")
                self.request({"op": "bind", "job": job, "key": key.hex()}, key=key)
                self.job, self.key = job, key
        except BaseException:
            self.sock.close()
            raise

    def request(
        self, message: dict, fds: list[int] = (), *, key: bytes | None = None
    ) -> tuple[dict, list[int]]:
        with self.lock:
            self.seq += 1
            body = json.dumps({**message, "seq": self.seq, "job": self.job or message.get("job")}).encode()
            signing = key or self.key
            tag = request_tag(signing, self.nonce, body) if signing else bytes(TAG_BYTES)
            data = tag + body
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
            raw, out, _flags = _receive(self.sock, MAX_REPLY)
        reply = _parse(raw) if raw else None
        if reply is None:
            _close_all(out)
            raise ConnectionError(f"holder at {self.path} closed the connection")
        if not reply.get("ok"):
            _close_all(out)
            raise HolderRefused(f"holder at {self.path}: {reply.get('error')}")
        return reply, out

    def register(self, name: str, fd: int, size: int) -> None:
        self.request({"op": "register", "name": name, "size": size}, [fd])

    def begin(self, name: str) -> None:
        self.request({"op": "begin", "name": name})

    def commit(self, name: str, meta: dict) -> None:
        self.request({"op": "commit", "name": name, "meta": meta})

    def open(self, name: str) -> tuple[int, int, dict | None]:
        """(descriptor, size, meta) of a slot, its size checked against the memory's; the caller closes it."""
        reply, fds = self.request({"op": "open", "name": name})
        if len(fds) != 1:
            _close_all(fds)
            raise ConnectionError(f"holder at {self.path} sent {len(fds)} descriptors for slot {name}")
        size, real = reply.get("size"), os.fstat(fds[0]).st_size
        if not _is_int(size) or size != real:
            os.close(fds[0])
            raise HolderRefused(f"slot {name} claims {size} bytes; its memory has {real}")
        return fds[0], size, reply.get("meta")

    def list(self, prefix: str = "") -> list[dict]:
        slots: list[dict] = []
        while True:
            reply = self.request(
                {"op": "list", "prefix": prefix, "after": slots[-1]["name"] if slots else ""}
            )[0]
            slots.extend(reply["slots"])
            if not reply.get("more") or not reply["slots"]:
                return slots

    def drop(self, prefix: str = "", *, above: int | None = None) -> int:
        return self.request({"op": "drop", "prefix": prefix, "above": above})[0]["dropped"]

    def stats(self) -> dict:
        return self.request({"op": "stats"})[0]

    def ping(self) -> dict:
        return self.request({"op": "ping"})[0]

    def close(self) -> None:
        self.sock.close()


def make_slot_fd(name: str, size: int) -> int:
    """A new slot's memory: a memfd the holder can seal."""
    fd = os.memfd_create(name[:200], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    return fd


# --- the command --------------------------------------------------------------------------------------------------
def _uids(text: str) -> frozenset[int] | None:
    parts = [p.strip() for p in text.replace(",", " ").split() if p.strip()]
    if "any" in parts:
        return None
    return frozenset({os.geteuid(), *(int(p) for p in parts)})


def main(argv: list[str] | None = None) -> None:
    import argparse

    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m lockstep_agent.snapshot_holder",
        description="Keep this node's protection snapshots in shared memory.",
    )
    parser.add_argument(
        "--socket", default=env("LOCKSTEP_PROTECT_HOLDER"), help="Unix socket path [LOCKSTEP_PROTECT_HOLDER]"
    )
    parser.add_argument(
        "--allow-uid",
        default=env("LOCKSTEP_HOLDER_ALLOW_UIDS", ""),
        help="other users' uids to serve, comma-separated, or 'any' (each job stays bound to the user that bound it); "
        "default: only the holder's own user [LOCKSTEP_HOLDER_ALLOW_UIDS]",
    )
    parser.add_argument(
        "--max-job-slots",
        type=int,
        default=int(env("LOCKSTEP_HOLDER_MAX_JOB_SLOTS", "256")),
        help="slots one job may keep [LOCKSTEP_HOLDER_MAX_JOB_SLOTS, 256]",
    )
    parser.add_argument(
        "--max-job-bytes",
        type=parse_bytes,
        default=env("LOCKSTEP_HOLDER_MAX_JOB_BYTES", "50%"),
        help="bytes one job's slots may claim: 64G, 50%% (of physical memory) [LOCKSTEP_HOLDER_MAX_JOB_BYTES, 50%%]",
    )
    parser.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=env("LOCKSTEP_HOLDER_MAX_BYTES", "75%"),
        help="bytes all slots may claim [LOCKSTEP_HOLDER_MAX_BYTES, 75%%]",
    )
    parser.add_argument(
        "--max-jobs",
        type=int,
        default=int(env("LOCKSTEP_HOLDER_MAX_JOBS", "256")),
        help="jobs the holder keeps slots for [LOCKSTEP_HOLDER_MAX_JOBS, 256]",
    )
    parser.add_argument(
        "--socket-mode",
        type=lambda text: int(text, 8),
        default=None,
        help="the socket's mode (octal); default 0600, or 0666 when other users are allowed",
    )
    args = parser.parse_args(argv)
    if not args.socket:
        parser.error("--socket (or LOCKSTEP_PROTECT_HOLDER) is required")
    limits = Limits(
        max_job_slots=args.max_job_slots,
        max_job_bytes=parse_bytes(args.max_job_bytes),
        max_bytes=parse_bytes(args.max_bytes),
        max_jobs=args.max_jobs,
        allow_uids=_uids(args.allow_uid),
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(args.socket, limits=limits, socket_mode=args.socket_mode)


if __name__ == "__main__":
    main()
