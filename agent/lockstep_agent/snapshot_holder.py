"""The per-node snapshot holder: a small process that keeps shared-memory slots alive across training restarts.

A training process creates each slot as an anonymous shared-memory file (``memfd_create``), maps it, and hands
the file descriptor to its node's holder over a Unix ``SOCK_SEQPACKET`` socket (``SCM_RIGHTS``). The holder
keeps the descriptor open, so the memory outlives the training process; a relaunched process asks for it back
and maps it again. Nothing is copied through the holder: it only keeps descriptors and each slot's metadata
(whose state, which iteration, how many bytes, and whether the slot is complete). When the holder dies with
its node, the kernel frees the memory: a node lost is its copies lost.

Run one per node, before the training processes: ``python -m lockstep_agent.snapshot_holder --socket PATH``
(it imports nothing but the standard library, so it starts in milliseconds and needs no torch).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading

log = logging.getLogger("lockstep_agent.snapshot_holder")

MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    data, fds, _flags, _address = socket.recv_fds(sock, MAX_MESSAGE, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), list(fds)


class Holder:
    """The slots of one node, keyed by name (``<job>/own/<rank>/<n>``, ``<job>/replica/<owner>/<n>``)."""

    def __init__(self):
        self.slots: dict[str, dict] = {}  # key -> {"fd", "size", "meta" (None while being written)}
        self.lock = threading.Lock()

    def handle(self, message: dict, fds: list[int]) -> tuple[dict, list[int]]:
        op = message.get("op")
        key = message.get("key", "")
        with self.lock:
            if op == "register":  # a new (or larger) slot for key: keep its descriptor
                if len(fds) != 1:
                    return {"ok": False, "error": "register needs one descriptor"}, []
                old = self.slots.pop(key, None)
                if old:
                    os.close(old["fd"])
                self.slots[key] = {"fd": fds[0], "size": int(message["size"]), "meta": None}
                return {"ok": True}, []
            for fd in fds:  # no other operation takes descriptors
                os.close(fd)
            slot = self.slots.get(key)
            if op == "begin":  # being overwritten: not a restore point until committed
                if slot is None:
                    return {"ok": False, "error": f"no slot {key}"}, []
                slot["meta"] = None
                return {"ok": True}, []
            if op == "commit":
                if slot is None:
                    return {"ok": False, "error": f"no slot {key}"}, []
                slot["meta"] = dict(message.get("meta") or {})
                return {"ok": True}, []
            if op == "open":
                if slot is None:
                    return {"ok": False, "error": f"no slot {key}"}, []
                return {"ok": True, "size": slot["size"], "meta": slot["meta"]}, [slot["fd"]]
            if op == "list":
                prefix = message.get("prefix", "")
                return {
                    "ok": True,
                    "slots": [
                        {"key": k, "size": s["size"], "meta": s["meta"]}
                        for k, s in sorted(self.slots.items())
                        if k.startswith(prefix)
                    ],
                }, []
            if op == "drop":  # forget slots under prefix, all or only those newer than "above"
                prefix, above = message.get("prefix", ""), message.get("above")
                dropped = 0
                for k in [k for k in self.slots if k.startswith(prefix)]:
                    meta = self.slots[k]["meta"]
                    if above is None or meta is None or meta.get("iteration", -1) > above:
                        os.close(self.slots.pop(k)["fd"])
                        dropped += 1
                return {"ok": True, "dropped": dropped}, []
            if op == "ping":
                return {
                    "ok": True,
                    "pid": os.getpid(),
                    "slots": len(self.slots),
                    "bytes": sum(s["size"] for s in self.slots.values()),
                }, []
            return {"ok": False, "error": f"unknown operation {op!r}"}, []


def serve(path: str, *, ready=None) -> None:
    """Serve the holder at ``path`` until SIGTERM/SIGINT. ``ready`` (an Event) is set once it listens."""
    holder = Holder()
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    stop = threading.Event()

    def connection(sock: socket.socket) -> None:
        with sock:
            while not stop.is_set():
                try:
                    message, fds = _receive(sock)
                except (OSError, ValueError):
                    return
                if message is None:
                    return
                reply, out = holder.handle(message, fds)
                try:
                    _send(sock, reply, out)
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=connection, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True, name="holder-accept").start()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    if ready is not None:
        ready.set()
    log.info("snapshot holder %d listening on %s", os.getpid(), path)
    try:
        stop.wait()
    finally:
        server.close()
        if os.path.exists(path):
            os.unlink(path)


class HolderClient:
    """One connection to the node's holder; thread-safe (one request at a time)."""

    def __init__(self, path: str, *, timeout: float = 10.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.lock = threading.Lock()

    def request(self, message: dict, fds: list[int] = ()) -> tuple[dict, list[int]]:
        with self.lock:
            _send(self.sock, message, fds)
            reply, out = _receive(self.sock)
        if reply is None:
            raise ConnectionError(f"holder at {self.path} closed the connection")
        if not reply.get("ok"):
            for fd in out:
                os.close(fd)
            raise RuntimeError(f"holder at {self.path}: {reply.get('error')}")
        return reply, out

    def register(self, key: str, fd: int, size: int) -> None:
        self.request({"op": "register", "key": key, "size": size}, [fd])

    def begin(self, key: str) -> None:
        self.request({"op": "begin", "key": key})

    def commit(self, key: str, meta: dict) -> None:
        self.request({"op": "commit", "key": key, "meta": meta})

    def open(self, key: str) -> tuple[int, int, dict | None]:
        """(descriptor, size, meta) of a slot; the caller closes the descriptor."""
        reply, fds = self.request({"op": "open", "key": key})
        return fds[0], reply["size"], reply["meta"]

    def list(self, prefix: str = "") -> list[dict]:
        return self.request({"op": "list", "prefix": prefix})[0]["slots"]

    def drop(self, prefix: str, *, above: int | None = None) -> int:
        return self.request({"op": "drop", "prefix": prefix, "above": above})[0]["dropped"]

    def ping(self) -> dict:
        return self.request({"op": "ping"})[0]

    def close(self) -> None:
        self.sock.close()


def make_slot_fd(name: str, size: int) -> int:
    fd = os.memfd_create(name[:200], os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lockstep_agent.snapshot_holder",
        description="Keep this node's protection snapshots in shared memory.",
    )
    parser.add_argument(
        "--socket",
        default=os.environ.get("LOCKSTEP_PROTECT_HOLDER"),
        help="Unix socket path [LOCKSTEP_PROTECT_HOLDER]",
    )
    args = parser.parse_args(argv)
    if not args.socket:
        parser.error("--socket (or LOCKSTEP_PROTECT_HOLDER) is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    serve(args.socket)


if __name__ == "__main__":
    main()
