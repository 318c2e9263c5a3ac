"""``Protection``: in-memory snapshots of a training job, replicated to a peer node, restored on relaunch."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import mmap
import os
import queue
import secrets
import signal
import socket
import statistics
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from lockstep_agent.protect import keys
from lockstep_agent.protect import state as packing
from lockstep_agent.protect.in_place import InPlaceRecovery
from lockstep_agent.protect.membership import Membership
from lockstep_agent.protect.report import SnapshotReporter
from lockstep_agent.snapshot_holder import JOB_NAME, HolderClient, make_slot_fd

log = logging.getLogger("lockstep_agent.protect")

MiB = 1 << 20


@dataclass
class RestoreResult:
    """What the runtime restored at start: ``kind`` is ``snapshot`` (from memory), ``disk_fallback`` (the newest
    disk checkpoint every rank has, because some rank's in-memory copies are all gone) or ``fresh``."""

    kind: str
    iteration: int = 0
    seconds: float = 0.0
    bytes: int = 0
    sources: dict[int, str] = field(default_factory=dict)  # rank -> where its state came from
    reason: str = ""
    refused: list[str] = field(
        default_factory=list
    )  # copies refused (wrong tag, wrong owner, malformed), and why


@dataclass
class HangReport:
    iteration: int  # the last iteration every rank finished
    seconds: float  # since that step
    usual_seconds: float  # the usual step time it is measured against
    stalled_ranks: list[
        int
    ]  # the ranks that did not reach the gradient sync (empty: the collective itself hangs)
    reporter_rank: int
    detail: str
    unverified_ranks: list[int] = field(default_factory=list)  # heartbeats missing or failing authentication


class _Slot:
    """One shared-memory slot of this process, mapped; its descriptor is kept by the node's holder."""

    def __init__(self, key: str, fd: int, size: int, iteration: int = -1, nbytes: int = 0):
        self.key, self.size, self.iteration, self.nbytes = key, size, iteration, nbytes
        self.pending: tuple[int, int] | None = (
            None  # (iteration, bytes) written, not yet sealed and committed
        )
        try:
            real = os.fstat(fd).st_size
            if real < size:
                raise ValueError(f"slot {key} claims {size} bytes; its memory has {real}")
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


class Protection(InPlaceRecovery):
    """Wrap a training loop::

        protect = Protection(model, optimizer, every=1, stateful={"data": sampler})
        for iteration in range(protect.start_iteration + 1, total + 1):
            ...  # forward, backward, optimizer.step()
            protect.step(iteration)

    Creating it restores every rank from the newest snapshot that survives (or the newest common disk
    checkpoint, or nothing); ``start_iteration`` is the iteration restored (0 when fresh). ``step`` snapshots
    the state into this node's holder every ``every`` iterations and hands it to a background thread that
    replicates it to the peer rank on the next node over a gloo group of its own.

    Everything is bound to the job's secret (``secret=``, else ``LOCKSTEP_PROTECT_SECRET``; ``protect.keys`` says
    where else it may come from): the holders serve the job's slots only to its ranks, every snapshot carries a tag
    that is checked before a byte of it is read on restore (a copy that fails is refused, said, and the next one
    tried), and the heartbeats in the job's store carry one too.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 1,
        stateful: dict[str, Any] | None = None,
        holder: str | None = None,
        node: str | None = None,
        checkpoint_dir: str | None = None,
        disk_every: int = 0,
        disk_keep: int = 2,
        job: str | None = None,
        slots: int = 3,
        restore: bool = True,
        hang_factor: float = 5.0,
        hang_min_seconds: float = 5.0,
        on_hang: Callable[[HangReport], None] | None = None,
        reporter: SnapshotReporter | None = None,
        replication_timeout: float = 120.0,
        write_through_signal: int | None = None,
        secret: bytes | str | None = None,
        membership: Membership | None = None,
    ):
        if every < 1:
            raise ValueError("every must be at least 1")
        self.model, self.optimizer, self.every = model, optimizer, every
        self.stateful = dict(stateful or {})
        self.node = node or os.environ.get("LOCKSTEP_NODE") or socket.gethostname()
        self.checkpoint_dir = checkpoint_dir or os.environ.get("LOCKSTEP_PROTECT_DIR") or None
        self.disk_every, self.disk_keep, self.slot_count = disk_every, disk_keep, max(2, slots)
        self.namespace = job or os.environ.get("LOCKSTEP_JOB_ID") or "job"
        if not JOB_NAME.fullmatch(self.namespace):
            raise ValueError(f"job {self.namespace!r}: a job name is 1-128 letters, digits and ._:@+=-")
        self.hang_factor, self.hang_min_seconds, self.on_hang = hang_factor, hang_min_seconds, on_hang
        self.replication_timeout = replication_timeout
        path = holder or os.environ.get("LOCKSTEP_PROTECT_HOLDER")
        if not path:
            raise ValueError(
                "no snapshot holder: pass holder= or set LOCKSTEP_PROTECT_HOLDER "
                "(start one per node with `python -m lockstep_agent.snapshot_holder --socket PATH`)"
            )
        self.reporter = reporter if reporter is not None else SnapshotReporter.from_environment()
        self.membership, self._secret, self._holder_path = membership, secret, path
        # A standby joining in a lost rank's place restores in place: no relaunch to report.
        self._in_place = membership is not None and membership.plan is not None
        self._replaced: dict | None = None
        self.events: list[dict] = []  # in-place reports (peer_lost, rank_replaced) and fallbacks, as sent
        self._zero_figures()
        self.holder = None
        self._begin(restore)
        if write_through_signal is not None:
            signal.signal(write_through_signal, lambda *_: self._write_through.set())

    def _begin(self, restore: bool) -> None:
        """Join the job's current process group and restore: at start, and again in each new generation (the
        same collectives in the same order on survivors and on a standby taking a lost rank's place)."""
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        self._join_peers()
        self.keys, self._launch = self._job_keys(self._secret)
        if self.membership is not None:
            self.membership.key = self.keys.beat  # rank 0 leads: it checks the standbys' tags with it
        self.holder = self._connect(self._holder_path)
        self.restored = self._restore() if restore else RestoreResult("fresh", reason="restore turned off")
        self.start_iteration = self.restored.iteration
        self._adopt_slots()
        self._start_replicator()
        self._start_watchdog(self.model)
        if self.restored.kind != "fresh":
            self._protect_restore_point()

    def _zero_figures(self) -> None:
        """The figures the runtime keeps (snapshots, overhead, hangs), from zero."""
        self.snapshots_taken = 0
        self.snapshots_skipped = 0
        self.blocked_seconds = 0.0
        # Training-thread time snapshots cost (captures, waits for a round, write-throughs): the overhead the
        # ledger books. Reported by rank 0 as the slowest rank's, each report carrying what accrued since the last.
        self.overhead_seconds = 0.0
        self._overhead_reported = 0.0
        self.capture_seconds: list[float] = []
        self.replication_seconds: list[float] = []
        self.last_replicated = -1
        self.last_disk_checkpoint = -1
        self.hangs: list[HangReport] = []
        self.error: BaseException | None = None

    def _join_peers(self) -> None:
        """Who holds whose replica: this job's gloo group, every rank's node, this rank's peers and slots."""
        bounded = {"timeout": datetime.timedelta(seconds=self.membership.timeout)} if self.membership else {}
        self.group = (
            dist.new_group(backend="gloo", **bounded) if self.distributed and self.world > 1 else None
        )
        self.nodes = self._gather([self.node]) if self.distributed else [[self.node]]
        self.node_of = [entry[0] for entry in self.nodes]
        self.next, self.prev = self._peers()
        self._own: list[_Slot | None] = [None] * self.slot_count
        self._replica: list[_Slot | None] = [None] * self.slot_count
        self._write_through = threading.Event()

    def _job_keys(self, secret: bytes | str | None) -> tuple[keys.JobKeys, bytes]:
        """The job's keys (``protect.keys`` says where the secret comes from) and this launch's nonce, the same on
        every rank. Collective; every rank raises when any rank cannot have them."""
        local, error = None, ""
        try:
            local = keys.configured_secret(secret)
        except (OSError, ValueError) as problem:
            error = str(problem)
        given = self._gather((local is not None, error))
        problems = [f"rank {rank}: {message}" for rank, (_, message) in enumerate(given) if message]
        if problems:
            raise ValueError("the job's protection secret: " + "; ".join(problems))
        everyone = all(has for has, _ in given)
        shared = torch.zeros(
            1 + 32 + 16, dtype=torch.uint8
        )  # failed?, root (when rank 0 hands it out), nonce
        if self.rank == 0:
            failure = b""
            root_key = bytes(32)
            if not everyone:
                where = "secret=" if secret is not None else keys.SECRET_ENV
                try:
                    if local is None:
                        where = keys.default_secret_file(self.checkpoint_dir, self.namespace)
                        local = keys.read_or_create_secret_file(where)
                    root_key = keys.root(local)
                except (OSError, ValueError) as problem:
                    failure = str(problem).encode()
                log.info("job %s: protection secret from %s, handed to every rank", self.namespace, where)
            shared[:] = torch.frombuffer(
                bytearray(bytes([1 if failure else 0]) + root_key + secrets.token_bytes(16)),
                dtype=torch.uint8,
            )
            if failure and self.group is None:
                raise ValueError(f"the job's protection secret: {failure.decode()}")
        if self.group is not None:
            dist.broadcast(shared, src=0, group=self.group)
        raw = bytes(shared.tolist())
        if raw[0]:
            raise ValueError(
                "the job's protection secret: rank 0 could not read or create the job's key file"
            )
        job_keys = keys.derive(keys.root(local) if everyone else raw[1:33], self.namespace)
        fingerprints = self._gather(job_keys.fingerprint)
        if len(set(fingerprints)) > 1:
            raise ValueError(
                f"the ranks disagree on the job's protection secret (fingerprints {fingerprints}): give every rank "
                f"the same {keys.SECRET_ENV}"
            )
        return job_keys, raw[33:]

    def _connect(self, path: str) -> HolderClient:
        """This rank's connection to its node's holder, bound to the job. Collective: when any rank cannot bind,
        every rank raises, saying which and why."""
        client, error = self.holder, ""
        try:
            if client is None:
                client = HolderClient(path, job=self.namespace, key=self.keys.holder)
        except (OSError, RuntimeError, ValueError) as problem:
            error = f"{type(problem).__name__}: {problem}"
        problems = [f"rank {rank}: {message}" for rank, message in enumerate(self._gather(error)) if message]
        if problems:
            if client is not None:
                client.close()
            raise RuntimeError("snapshot holder: " + "; ".join(problems))
        return client

    def _start_replicator(self) -> None:
        """The background thread that replicates each round's snapshot to the peer."""
        self._rounds: queue.Queue = queue.Queue()
        self._round_done = threading.Event()
        self._round_done.set()
        self._closed = threading.Event()
        self._replicator = threading.Thread(
            target=self._replicate_loop, name="lockstep-protect-replicate", daemon=True
        )
        self._replicator.start()

    def _start_watchdog(self, model: torch.nn.Module) -> None:
        """The heartbeats (through the job's TCP store, where it has one) and the thread that watches them."""
        self._last_step_at = time.monotonic()
        self._last_iteration = self.start_iteration
        self._intervals: deque[float] = deque(maxlen=50)
        self._synced = False
        self._hang_reported_for = -1
        self._beats_written = 0
        self.unverified_beats = (
            0  # heartbeats read that were missing, forged, replayed or from another launch
        )
        self._store = self._watch_store = None
        if self.distributed and (
            self.membership is not None or (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
        ):
            self._store, self._watch_store = self._beat_store(), self._beat_store()
        self._beat("done", self.start_iteration)
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self._hook_ddp(model)
        self._watchdog = threading.Thread(
            target=self._watch_loop, name="lockstep-protect-watchdog", daemon=True
        )
        self._watchdog.start()

    def _protect_restore_point(self) -> None:
        """Protect the restore point again at once: a replaced node's holder starts empty, so the state it
        should keep (its rank's own copy, its predecessor's replica) exists nowhere else until re-sent."""
        self._round_done.clear()
        started = time.perf_counter()
        slot = self._capture(self.start_iteration)
        self.overhead_seconds += time.perf_counter() - started
        self._rounds.put((self.start_iteration, slot, False, time.perf_counter() - started))

    # --- the training loop's side --------------------------------------------------------------------------
    def step(self, iteration: int) -> None:
        """Call after each optimizer step with the iteration just finished."""
        self._raise_peer_loss()
        now = time.monotonic()
        self._intervals.append(now - self._last_step_at)
        self._last_step_at, self._last_iteration, self._synced = now, iteration, False
        self._beat("done", iteration)
        self._after_step(iteration)
        disk = bool(self.checkpoint_dir) and (
            self._write_through.is_set() or (self.disk_every and iteration % self.disk_every == 0)
        )
        # The previous round must have replicated (and been acknowledged) before the next step counts as
        # done: that bounds the work a lost node costs to one snapshot interval.
        if not self._round_done.is_set():
            started = time.perf_counter()
            finished = self._round_done.wait(self.replication_timeout)
            self.blocked_seconds += time.perf_counter() - started
            self.overhead_seconds += time.perf_counter() - started
            if not finished:
                self.snapshots_skipped += 1
                log.warning(
                    "rank %d: replication after iteration %d is still running; no snapshot at %d",
                    self.rank,
                    self.last_replicated,
                    iteration,
                )
                return
        if iteration % self.every and not disk:
            return
        started = time.perf_counter()
        self._round_done.clear()
        slot = self._capture(iteration)
        if disk:
            self._write_through.clear()
        self.capture_seconds.append(time.perf_counter() - started)
        self.overhead_seconds += self.capture_seconds[-1]
        self._rounds.put((iteration, slot, disk, self.capture_seconds[-1]))

    def mark_sync(self) -> None:
        """Say this rank reached its gradient sync (done for you with DistributedDataParallel). The watchdog
        names a rank that stalls before it as the one that stalled."""
        if not self._synced:
            self._synced = True
            self._beat("sync", self._last_iteration + 1)

    def write_through(self) -> str | None:
        """Write the newest snapshot through to disk now (e.g. before a planned drain); returns the path."""
        if not self.checkpoint_dir:
            raise ValueError("no checkpoint_dir to write through to")
        started = time.perf_counter()
        self._round_done.wait(self.replication_timeout)
        newest = max((s for s in self._own if s and s.nbytes), key=lambda s: s.iteration, default=None)
        if newest is None:
            return None
        path = self._write_disk(newest)
        self.overhead_seconds += time.perf_counter() - started
        self._report(
            {
                "kind": "write_through",
                "iteration": newest.iteration,
                "bytes": newest.nbytes,
                "locations": [{"rank": self.rank, "disk": path}],
            }
        )
        return path

    def request_write_through(self) -> None:
        """Ask for a write-through at the next snapshot (safe from a signal handler or another thread)."""
        self._write_through.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the round in flight (tests, benchmarks, before exit)."""
        return self._round_done.wait(timeout)

    def close(self) -> None:
        self.wait(self.replication_timeout)
        self._closed.set()
        self._rounds.put(None)
        self._replicator.join(timeout=10)
        if self.reporter:
            self.reporter.flush()

    def state_dict(self, iteration: int) -> dict[str, Any]:
        state: dict[str, Any] = {"iteration": int(iteration), "model": self.model.state_dict()}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        for name, obj in self.stateful.items():
            state[f"stateful.{name}"] = obj.state_dict()
        state["rng"] = packing.rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        for name, obj in self.stateful.items():
            obj.load_state_dict(state[f"stateful.{name}"])
        packing.set_rng_state(state["rng"])

    # --- snapshots -------------------------------------------------------------------------------------------
    def _key(self, kind: str, owner: int, index: int) -> str:
        return f"{kind}/{owner}/{index}"

    def _slot_for(self, slots: list[_Slot | None], kind: str, owner: int, nbytes: int) -> tuple[int, _Slot]:
        """The slot to overwrite: the oldest (or empty) one, grown when the state no longer fits."""
        index = min(range(len(slots)), key=lambda i: -2 if slots[i] is None else slots[i].iteration)
        slot = slots[index]
        if slot is None or slot.size < nbytes:
            size = (int(nbytes * 1.1) // MiB + 1) * MiB
            key = self._key(kind, owner, index)
            fd = make_slot_fd(f"{self.namespace}/{key}", size)
            self.holder.register(key, fd, size)
            slot = slots[index] = _Slot(key, fd, size)
        return index, slot

    def _capture(self, iteration: int) -> _Slot:
        """Copy the state into an own slot (the training thread's part); the replicator seals and commits it."""
        packed = packing.Packed(self.state_dict(iteration), iteration, owner=self.rank, world=self.world)
        _, slot = self._slot_for(self._own, "own", self.rank, packed.nbytes)
        self.holder.begin(slot.key)
        slot.iteration, slot.nbytes = -1, 0
        packed.write_into(slot.tensor)
        slot.pending = (iteration, packed.nbytes)
        self.snapshots_taken += 1
        return slot

    def _seal(self, slot: _Slot) -> None:
        """Tag the own slot just written with the job's snapshot key, then commit it: a restore point."""
        iteration, nbytes = slot.pending
        packing.seal(slot.tensor[:nbytes], self.keys.snapshot)
        self.holder.commit(slot.key, self._meta(self.rank, iteration, nbytes, "own"))
        slot.iteration, slot.nbytes, slot.pending = iteration, nbytes, None

    def _meta(self, owner: int, iteration: int, nbytes: int, kind: str) -> dict:
        return {
            "owner": owner,
            "iteration": iteration,
            "nbytes": nbytes,
            "kind": kind,
            "world": self.world,
            "node": self.node,
            "at": time.time(),
        }

    def _replicate_loop(self) -> None:
        while True:
            item = self._rounds.get()
            if item is None:
                return
            iteration, slot, disk, capture_seconds = item
            try:
                started = time.perf_counter()
                self._seal(slot)
                stats = torch.tensor([slot.nbytes, 0.0, self.overhead_seconds], dtype=torch.float64)
                if self.group is not None:
                    self._replicate(iteration, slot)
                    stats[1] = time.perf_counter() - started
                    everyone = [torch.zeros(3, dtype=torch.float64) for _ in range(self.world)]
                    dist.all_gather(everyone, stats, group=self.group)  # every rank's copy is now replicated
                else:
                    everyone = [stats]
                seconds = time.perf_counter() - started
                self.replication_seconds.append(seconds)
                self.last_replicated = iteration
                if disk:
                    self._write_disk(slot)
                if self.rank == 0:
                    slowest = max(float(s[2]) for s in everyone)
                    overhead, self._overhead_reported = max(0.0, slowest - self._overhead_reported), slowest
                    self._report(
                        {
                            "kind": "snapshot",
                            "iteration": iteration,
                            "seconds": round(max(float(s[1]) for s in everyone) + capture_seconds, 6),
                            "overhead_seconds": round(overhead, 6),
                            "bytes": int(sum(float(s[0]) for s in everyone)),
                            "locations": self._locations(),
                            **self._allocation(),
                        }
                    )
            except Exception as error:  # a peer gone: the job is about to be relaunched; stop replicating
                self.error = error
                log.error("rank %d: replication of iteration %d failed: %s", self.rank, iteration, error)
                self._round_done.set()
                return
            self._round_done.set()

    def _replicate(self, iteration: int, slot: _Slot) -> None:
        """One ring round: send my copy to ``next``, keep ``prev``'s, acknowledge once it is committed."""
        header_out = torch.tensor([iteration, slot.nbytes], dtype=torch.int64)
        header_in = torch.zeros(2, dtype=torch.int64)
        self._exchange(header_out, header_in)
        their_iteration, their_bytes = (int(v) for v in header_in.tolist())
        _, replica = self._slot_for(self._replica, "replica", self.prev, their_bytes)
        self.holder.begin(replica.key)
        replica.iteration, replica.nbytes = -1, 0
        self._exchange(slot.tensor[: slot.nbytes], replica.tensor[:their_bytes])
        self.holder.commit(replica.key, self._meta(self.prev, their_iteration, their_bytes, "replica"))
        replica.iteration, replica.nbytes = their_iteration, their_bytes
        acknowledged = torch.zeros(1, dtype=torch.int64)
        works = [
            dist.isend(torch.tensor([their_iteration], dtype=torch.int64), dst=self.prev, group=self.group),
            dist.irecv(acknowledged, src=self.next, group=self.group),
        ]
        for work in works:
            work.wait()
        if int(acknowledged) != iteration:
            raise RuntimeError(f"peer acknowledged iteration {int(acknowledged)}, not {iteration}")

    def _exchange(self, outgoing: torch.Tensor, incoming: torch.Tensor) -> None:
        works = [
            dist.irecv(incoming, src=self.prev, group=self.group),
            dist.isend(outgoing, dst=self.next, group=self.group),
        ]
        for work in works:
            work.wait()

    def _peers(self) -> tuple[int, int]:
        """The rank that keeps my replica (same local index on the next node) and the rank whose I keep."""
        if self.world == 1:
            self.peer_of = {0: 0}
            return 0, 0
        order: list[str] = []
        members: dict[str, list[int]] = {}
        for rank, node in enumerate(self.node_of):
            if node not in members:
                order.append(node)
            members.setdefault(node, []).append(rank)
        sizes = {len(m) for m in members.values()}
        if len(order) > 1 and len(sizes) == 1:
            mapping = {}
            for position, node in enumerate(order):
                following = members[order[(position + 1) % len(order)]]
                for local, rank in enumerate(members[node]):
                    mapping[rank] = following[local]
        else:
            if len(order) == 1:
                log.warning("all ranks are on node %s: replicas do not survive losing it", order[0])
            mapping = {rank: (rank + 1) % self.world for rank in range(self.world)}
        self.peer_of = mapping
        inverse = {peer: rank for rank, peer in mapping.items()}
        return mapping[self.rank], inverse[self.rank]

    def _locations(self) -> list[dict]:
        if self.world > 64:
            return [
                {
                    "ranks": self.world,
                    "own": "each rank's node",
                    "replica": "the same local rank's, next node",
                }
            ]
        return [
            {
                "rank": r,
                "own": self.node_of[r],
                "replica": self.node_of[self.peer_of[r]] if self.world > 1 else None,
            }
            for r in range(self.world)
        ]

    # --- disk ----------------------------------------------------------------------------------------------
    def _disk_folder(self, rank: int) -> str:
        return os.path.join(self.checkpoint_dir, self.namespace, f"rank{rank}")

    def _disk_path(self, rank: int, iteration: int) -> str:
        return os.path.join(self._disk_folder(rank), f"iter{iteration:012d}.snap")

    def _write_disk(self, slot: _Slot) -> str:
        folder = self._disk_folder(self.rank)
        os.makedirs(folder, exist_ok=True)
        path = self._disk_path(self.rank, slot.iteration)
        temporary = f"{path}.tmp{os.getpid()}"
        with open(temporary, "wb") as out:
            view = memoryview(slot.map)
            try:
                out.write(view[: slot.nbytes])
            finally:
                view.release()
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        directory = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self.last_disk_checkpoint = max(self.last_disk_checkpoint, slot.iteration)
        for old in sorted(self._disk_iterations(self.rank))[: -self.disk_keep or None]:
            os.unlink(self._disk_path(self.rank, old))
        return path

    def _disk_iterations(self, rank: int) -> list[int]:
        """The iterations of this rank's complete disk checkpoints, by their headers (verified when loaded)."""
        if not self.checkpoint_dir or not os.path.isdir(self._disk_folder(rank)):
            return []
        found = []
        for name in os.listdir(self._disk_folder(rank)):
            if name.startswith("iter") and name.endswith(".snap"):
                path = os.path.join(self._disk_folder(rank), name)
                try:
                    with open(path, "rb") as handle:
                        iteration, total = packing.peek(handle.read(packing.DATA_START))
                    if os.path.getsize(path) >= total and name == f"iter{iteration:012d}.snap":
                        found.append(iteration)
                except (OSError, ValueError, struct.error):
                    continue
        return found

    # --- restore ---------------------------------------------------------------------------------------------
    def _gather(self, value: Any) -> list[Any]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, value, group=self.group)
        return out

    def _restore(self) -> RestoreResult:
        """Every rank's state from the newest iteration whose copies all survive in memory and prove to be this
        job's, else from the newest disk checkpoint every rank has that proves so, else nothing (``fresh``).
        A copy that fails (its tag is not the job's, it is another rank's, it is malformed) is refused, said, and
        the next best copy tried. Collective: every rank calls it."""
        started = time.perf_counter()
        by_iteration, refused = self._snapshots_in_memory()
        for _attempt in range(4):
            chosen = next(
                (i for i in sorted(by_iteration, reverse=True) if len(by_iteration[i]) == self.world), None
            )
            if chosen is None:
                break
            restored = self._restore_snapshot(chosen, by_iteration[chosen], started, refused)
            if restored is not None:
                return restored
        # No iteration every rank still has, and can prove, in memory.
        reason, anything = self._no_snapshot_reason(by_iteration, refused)
        self.holder.drop()
        restored, reason = self._restore_disk(reason, started, refused)
        if restored is not None:
            return restored
        if anything:
            log.warning("rank %d: %s and no disk checkpoint; starting afresh", self.rank, reason)
        return RestoreResult(
            "fresh",
            0,
            time.perf_counter() - started,
            reason=reason + ("; no disk checkpoint either" if anything else ""),
            refused=refused,
        )

    def _snapshots_in_memory(self) -> tuple[dict[int, dict[int, list[dict]]], list[str]]:
        """Every rank's holder's complete copies of this world's snapshots (iteration -> owner rank -> copies), and
        the copies refused already for what their names and metadata say."""
        mine, refused = [], []
        for entry in self.holder.list():
            if entry["meta"] is None:
                continue  # being written when its writer stopped: not a restore point
            problem = self._listed_problem(entry)
            if problem:
                refused.append(f"slot {entry['name'][:80]} on {self.node}: {problem}")
            elif entry["meta"]["world"] == self.world:
                mine.append(dict(entry, holder=self.rank))
        everything = [entry for entries in self._gather(mine) for entry in entries]
        refused = [line for lines in self._gather(refused) for line in lines]
        by_iteration: dict[int, dict[int, list[dict]]] = {}
        for entry in everything:
            meta = entry["meta"]
            by_iteration.setdefault(meta["iteration"], {}).setdefault(meta["owner"], []).append(entry)
        return by_iteration, refused

    def _listed_problem(self, entry: dict) -> str:
        """Why a listed slot cannot be a copy of a snapshot of this job ('' when it can be)."""
        meta, parts = entry["meta"], entry["name"].split("/")
        if not isinstance(meta, dict) or len(parts) != 3 or parts[0] not in ("own", "replica"):
            return "not a slot of the runtime's"
        fields = [meta.get(k) for k in ("owner", "iteration", "nbytes", "world")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in fields):
            return "its metadata is malformed"
        owner, iteration, nbytes, world = fields
        if not (0 <= owner < max(world, 1) and iteration >= 0 and world >= 1):
            return "its metadata is malformed"
        if parts[1] != str(owner) or meta.get("kind") != parts[0]:
            return "its name and its metadata disagree"
        if not packing.DATA_START <= nbytes <= entry["size"]:
            return f"it claims {nbytes} bytes in a slot of {entry['size']}"
        return ""

    def _restore_snapshot(
        self, chosen: int, copies: dict[int, list[dict]], started: float, refused: list[str]
    ) -> RestoreResult | None:
        """Restore iteration ``chosen`` from memory, each rank from its own copy where it survives. None when a
        copy is refused: it is struck from ``copies`` (and said in ``refused``), so the caller can try again."""
        sources = {
            owner: min(entries, key=lambda e: (e["holder"] != owner, e["holder"]))
            for owner, entries in copies.items()
        }
        state, problem = self._fetch(chosen, sources)
        problems = self._gather(problem)
        if any(problems):
            for owner, message in enumerate(problems):
                if message:
                    source = sources[owner]
                    copies[owner].remove(source)
                    if not copies[owner]:
                        del copies[owner]
                    where = "own copy" if source["holder"] == owner else "replica"
                    line = f"rank {owner}'s {where} of iteration {chosen} on {self.node_of[source['holder']]}: {message}"
                    refused.append(line)
                    if self.rank == owner:
                        log.error("rank %d: refused its %s", self.rank, line)
            return None
        self.load_state_dict(state)
        self.holder.drop(above=chosen)  # copies of a future that did not happen
        result = RestoreResult(
            "snapshot",
            chosen,
            time.perf_counter() - started,
            sum(s["meta"]["nbytes"] for s in sources.values()),
            {
                o: f"{'own copy' if s['holder'] == o else 'replica'} on {self.node_of[s['holder']]}"
                for o, s in sorted(sources.items())
            },
            refused=refused,
        )
        log.info(
            "rank %d restored iteration %d from %s in %.3fs",
            self.rank,
            chosen,
            result.sources[self.rank],
            result.seconds,
        )
        if not self._in_place:
            self._report(
                {
                    "kind": "restore",
                    "iteration": chosen,
                    "seconds": round(result.seconds, 6),
                    "bytes": result.bytes,
                    "locations": [{"rank": o, "source": s} for o, s in sorted(result.sources.items())][:64],
                    **self._fallback_reason(),
                },
                rank0=True,
            )
        return result

    def _no_snapshot_reason(
        self, by_iteration: dict[int, dict[int, list[dict]]], refused: list[str]
    ) -> tuple[str, bool]:
        """Why no iteration can be restored from memory, and whether there was anything at all."""
        newest = max((i for i, owners in by_iteration.items() if owners), default=None)
        reason = "no snapshot in memory"
        if newest is not None:
            survivors = {owner for owners in by_iteration.values() for owner in owners}
            lost = sorted(set(range(self.world)) - survivors)
            if lost:
                reason = (
                    f"every copy of rank(s) {', '.join(map(str, lost))} is gone (its own copy and its replica "
                    f"on the peer node); the newest snapshot was iteration {newest}"
                )
            else:
                reason = "no iteration has a surviving copy on every rank"
        if refused:
            shown = "; ".join(refused[:4]) + (f"; and {len(refused) - 4} more" if len(refused) > 4 else "")
            reason += f"; {len(refused)} cop{'y' if len(refused) == 1 else 'ies'} refused ({shown})"
        return reason, newest is not None or bool(refused)

    def _restore_disk(
        self, reason: str, started: float, refused: list[str]
    ) -> tuple[RestoreResult | None, str]:
        """Restore the newest disk checkpoint every rank has and can prove (None where there is none), and the
        reason, with the checkpoints refused on the way."""
        disk = self._gather(sorted(self._disk_iterations(self.rank)))
        common = set(disk[0]).intersection(*map(set, disk[1:])) if disk else set()
        for iteration in sorted(common, reverse=True)[:4]:
            state, problem, size = None, "", 0
            try:
                with open(self._disk_path(self.rank, iteration), "rb") as handle:
                    data = bytearray(handle.read())
                size = len(data)
                state = self._unpack(data, iteration)
            except (OSError, ValueError) as error:
                problem = str(error)
            problems = self._gather(problem)
            if any(problems):
                refused.extend(
                    f"rank {rank}'s disk checkpoint of iteration {iteration}: {message}"
                    for rank, message in enumerate(problems)
                    if message
                )
                ranks = ", ".join(str(rank) for rank, message in enumerate(problems) if message)
                reason = f"{reason}; rank(s) {ranks}'s disk checkpoint of iteration {iteration} refused"
                continue
            return self._restored_from_disk(state, iteration, size, reason, started, refused), reason
        return None, reason

    def _restored_from_disk(
        self, state: dict, iteration: int, size: int, reason: str, started: float, refused: list[str]
    ) -> RestoreResult:
        self.load_state_dict(state)
        result = RestoreResult(
            "disk_fallback",
            iteration,
            time.perf_counter() - started,
            size,
            {r: "disk checkpoint" for r in range(self.world)},
            reason,
            refused,
        )
        log.warning(
            "rank %d: %s; fell back to the disk checkpoint at iteration %d", self.rank, reason, iteration
        )
        self._report(
            {
                "kind": "disk_fallback",
                "iteration": iteration,
                "seconds": round(result.seconds, 6),
                "bytes": size,
                "note": reason[:1000],
                "locations": [{"rank": r, "source": "disk checkpoint"} for r in range(min(self.world, 64))],
                **self._fallback_reason(),
            },
            rank0=True,
        )
        return result

    def _unpack(self, buffer, iteration: int) -> dict[str, Any]:
        """My state at ``iteration`` from a copy, once its tag proves it is this job's, mine and of this world;
        ``SnapshotRefused`` otherwise. Nothing of the copy is read before its tag is checked."""
        found, state = packing.unpack(buffer, self.keys.snapshot, owner=self.rank, world=self.world)
        if found != iteration:
            raise packing.SnapshotRefused(f"it holds iteration {found}, not {iteration}")
        return state

    def _fetch(self, chosen: int, sources: dict[int, dict]) -> tuple[dict[str, Any] | None, str]:
        """My state from its chosen copy (my own slot, or a replica that its holder rank sends me), and '' — or
        None and why the copy was refused. Every rank sends what it was asked for, whatever it holds, so that a
        bad copy costs a refusal, never a hang."""
        state, problem = None, ""
        for owner, source in sorted(sources.items()):
            holder_rank, nbytes = source["holder"], source["meta"]["nbytes"]
            if holder_rank == owner == self.rank:
                try:
                    slot = self._open(source["name"])
                    try:
                        state = self._unpack(slot.tensor[:nbytes], chosen)
                    finally:
                        del slot
                except (OSError, ValueError, RuntimeError) as error:
                    problem = str(error)
            elif holder_rank == self.rank:
                try:
                    slot = self._open(source["name"])
                    outgoing = (
                        slot.tensor[:nbytes]
                        if slot.size >= nbytes
                        else torch.zeros(nbytes, dtype=torch.uint8)
                    )
                except (OSError, ValueError, RuntimeError) as error:
                    log.error("rank %d: cannot send rank %d its replica: %s", self.rank, owner, error)
                    slot, outgoing = None, torch.zeros(nbytes, dtype=torch.uint8)
                dist.send(outgoing, dst=owner, group=self.group)
                del outgoing, slot
            elif owner == self.rank:
                buffer = torch.empty(nbytes, dtype=torch.uint8)
                dist.recv(buffer, src=holder_rank, group=self.group)
                try:
                    state = self._unpack(buffer, chosen)
                except ValueError as error:
                    problem = str(error)
        if state is None and not problem:
            problem = "no copy of its state arrived"
        return state, problem

    def _open(self, name: str) -> _Slot:
        fd, size, _ = self.holder.open(name)
        return _Slot(name, fd, size)

    def _adopt_slots(self) -> None:
        """Reuse the slots my node's holder already keeps for me (after a relaunch), newest iteration kept."""
        for slot in self.holder.list():
            parts = slot["name"].split("/")
            if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
                continue
            kind, owner, index = parts[0], int(parts[1]), int(parts[2])
            slots = (
                self._own
                if (kind, owner) == ("own", self.rank)
                else self._replica
                if (kind, owner) == ("replica", self.prev)
                else None
            )
            if slots is None or index >= len(slots):
                continue
            meta = slot["meta"] if isinstance(slot["meta"], dict) and not self._listed_problem(slot) else None
            fd, size, _ = self.holder.open(slot["name"])
            slots[index] = _Slot(
                slot["name"], fd, size, meta["iteration"] if meta else -1, meta["nbytes"] if meta else 0
            )

    # --- the watchdog -------------------------------------------------------------------------------------
    def _beat_store(self):
        where = self.membership  # the job's store (a standby started later has another MASTER_ADDR)
        store = dist.TCPStore(
            where.host if where else os.environ["MASTER_ADDR"],
            where.port if where else int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=30),
        )
        return dist.PrefixStore(f"lockstep-protect/{self.namespace}/", store)

    def _beat_tag(self, rank: int, value: str) -> str:
        message = b"lockstep-protect-beat/1\0" + self._launch + f"|{rank}|{value}".encode()
        return hmac.new(self.keys.beat, message, hashlib.sha256).hexdigest()[:32]

    def _beat(self, phase: str, iteration: int) -> None:
        """This rank's heartbeat in the job's store: where it is, tagged with the job's heartbeat key and bound to
        this launch, so that whoever else reaches the store can neither forge one nor replay an old launch's."""
        if self._store is not None:
            self._beats_written += 1
            value = f"{iteration}:{phase}:{time.time():.3f}:{self._beats_written}"
            try:
                self._store.set(f"beat/{self.rank}", f"{value}:{self._beat_tag(self.rank, value)}")
            except Exception as error:  # the store went with rank 0's node; the relaunch will follow
                log.debug("beat failed: %s", error)

    def _read_beat(self, rank: int) -> tuple[tuple[int, str] | None, str]:
        """Rank ``rank``'s (iteration, phase) from its heartbeat, or None and why it cannot be believed."""
        key = f"beat/{rank}"
        try:
            if not self._watch_store.check([key]):
                return None, "missing"
            raw = self._watch_store.get(key).decode(errors="replace")
        except Exception:
            return None, "unreadable"
        value, _, tag = raw.rpartition(":")
        parts = value.split(":")
        if len(parts) != 4 or not hmac.compare_digest(tag.encode(), self._beat_tag(rank, value).encode()):
            return None, "its tag is wrong (forged, or from another launch)"
        iteration, phase = int(parts[0]), parts[1]
        # Ranks in lockstep are at most one gradient sync apart: a beat further from mine is a replayed old one.
        position, mine = 2 * iteration - (phase == "sync"), 2 * self._last_iteration
        if not mine - 2 <= position <= mine + 4:
            return None, f"iteration {iteration} is not where rank {rank} can be (replayed?)"
        return (iteration, phase), ""

    def _hook_ddp(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        """Mark the gradient sync, then all-reduce exactly as DDP's built-in reducer does (scale by 1/world
        while the bucket is filled, then sum), so that a protected job computes the same bits as without it."""

        def hook(process_group, bucket):
            self.mark_sync()
            group = process_group if process_group is not None else dist.group.WORLD
            tensor = bucket.buffer().mul_(1.0 / dist.get_world_size(group))
            future = dist.all_reduce(tensor, group=group, async_op=True).get_future()
            return future.then(lambda done: done.value()[0])

        ddp.register_comm_hook(ddp.process_group, hook)

    def _stalled(self) -> tuple[list[int], str, list[int]]:
        """The ranks that stalled, why this rank thinks so, and the ranks whose heartbeats it could not believe
        (missing, forged, replayed: never named as stalled, for a forger must not choose whom Lockstep blames)."""
        if self._watch_store is None:
            mine = "before" if not self._synced else "in"
            return (
                ([self.rank] if not self._synced else []),
                f"rank {self.rank} is {mine} its gradient sync",
                [],
            )
        beats = {
            self.rank: (self._last_iteration + 1, "sync") if self._synced else (self._last_iteration, "done")
        }
        unverified: dict[int, str] = {}
        for rank in range(self.world):
            if rank != self.rank:
                beat, problem = self._read_beat(rank)
                if beat is None:
                    unverified[rank] = problem
                else:
                    beats[rank] = beat
        if unverified:
            self.unverified_beats += len(unverified)
            log.warning(
                "rank %d: heartbeats not believed: %s",
                self.rank,
                "; ".join(f"rank {r}: {why}" for r, why in sorted(unverified.items())),
            )
        stalled, detail = self._name_stalled(beats)
        if unverified:
            detail += f"; heartbeat(s) of rank(s) {', '.join(map(str, sorted(unverified)))} not believed"
        return stalled, detail, sorted(unverified)

    def _name_stalled(self, beats: dict[int, tuple[int, str]]) -> tuple[list[int], str]:
        front = max((i if p == "done" else i - 1) for i, p in beats.values())
        waiting = [r for r, (i, p) in beats.items() if p == "sync" and i == front + 1]
        behind = [r for r, (i, p) in beats.items() if r not in waiting]
        if waiting and behind:
            return behind, (
                f"rank(s) {', '.join(map(str, behind))} did not reach the gradient sync of iteration "
                f"{front + 1}; rank(s) {', '.join(map(str, waiting))} wait for them there"
            )
        if not behind:
            return [], f"every rank waits in the gradient sync of iteration {front + 1}: the collective hangs"
        lowest = min(i for i, _ in beats.values())
        late = [r for r, (i, _) in beats.items() if i == lowest]
        if len(late) < len(beats):
            return late, f"rank(s) {', '.join(map(str, late))} are behind at iteration {lowest}"
        return [], "no rank has reached the gradient sync; cannot tell which stalled"

    def _watch_loop(self) -> None:
        closed = self._closed  # this generation's: a new generation starts a watchdog of its own
        while not closed.wait(0.2):
            if len(self._intervals) < 3:
                continue
            usual = statistics.median(list(self._intervals)[1:] or self._intervals)
            waited = time.monotonic() - self._last_step_at
            if (
                waited < max(self.hang_factor * usual, self.hang_min_seconds)
                or self._hang_reported_for == self._last_iteration
            ):
                continue
            self._hang_reported_for = self._last_iteration
            stalled, detail, unverified = self._stalled()
            report = HangReport(
                self._last_iteration,
                round(waited, 3),
                round(usual, 4),
                stalled,
                self.rank,
                detail,
                unverified,
            )
            self.hangs.append(report)
            log.error("rank %d: hang: no step for %.1fs (usual %.3fs): %s", self.rank, waited, usual, detail)
            if self.on_hang:
                self.on_hang(report)
            if stalled and self.rank == min(set(range(self.world)) - set(stalled), default=self.rank):
                self._report(
                    {
                        "kind": "hang",
                        "iteration": report.iteration,
                        "seconds": report.seconds,
                        "note": detail[:300],
                        "stalled_ranks": stalled,
                        "locations": [{"rank": r, "node": self.node_of[r]} for r in stalled],
                    }
                )

    def _report(self, body: dict, *, rank0: bool = False) -> None:
        if self.reporter is not None and (not rank0 or self.rank == 0):
            self.reporter.report(body)
