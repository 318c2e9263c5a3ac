"""``Protection``: in-memory snapshots of a training job, replicated to a peer node, restored on relaunch."""

from __future__ import annotations

import datetime
import logging
import mmap
import os
import queue
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

from lockstep_agent.protect import state as packing
from lockstep_agent.protect.report import SnapshotReporter
from lockstep_agent.snapshot_holder import HolderClient, make_slot_fd

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


class _Slot:
    """One shared-memory slot of this process, mapped; its descriptor is kept by the node's holder."""

    def __init__(self, key: str, fd: int, size: int, iteration: int = -1, nbytes: int = 0):
        self.key, self.size, self.iteration, self.nbytes = key, size, iteration, nbytes
        self.map = mmap.mmap(fd, size)
        os.close(fd)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


class Protection:
    """Wrap a training loop::

        protect = Protection(model, optimizer, every=1, stateful={"data": sampler})
        for iteration in range(protect.start_iteration + 1, total + 1):
            ...  # forward, backward, optimizer.step()
            protect.step(iteration)

    Creating it restores every rank from the newest snapshot that survives (or the newest common disk
    checkpoint, or nothing); ``start_iteration`` is the iteration restored (0 when fresh). ``step`` snapshots
    the state into this node's holder every ``every`` iterations and hands it to a background thread that
    replicates it to the peer rank on the next node over a gloo group of its own.
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
    ):
        if every < 1:
            raise ValueError("every must be at least 1")
        self.model, self.optimizer, self.every = model, optimizer, every
        self.stateful = dict(stateful or {})
        self.node = node or os.environ.get("LOCKSTEP_NODE") or socket.gethostname()
        self.checkpoint_dir = checkpoint_dir or os.environ.get("LOCKSTEP_PROTECT_DIR") or None
        self.disk_every, self.disk_keep, self.slot_count = disk_every, disk_keep, max(2, slots)
        self.namespace = job or os.environ.get("LOCKSTEP_JOB_ID") or "job"
        self.hang_factor, self.hang_min_seconds, self.on_hang = hang_factor, hang_min_seconds, on_hang
        self.replication_timeout = replication_timeout
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        path = holder or os.environ.get("LOCKSTEP_PROTECT_HOLDER")
        if not path:
            raise ValueError(
                "no snapshot holder: pass holder= or set LOCKSTEP_PROTECT_HOLDER "
                "(start one per node with `python -m lockstep_agent.snapshot_holder --socket PATH`)"
            )
        self.holder = HolderClient(path)
        self.reporter = reporter if reporter is not None else SnapshotReporter.from_environment()
        self._zero_figures()
        self._join_peers()
        self.restored = self._restore() if restore else RestoreResult("fresh", reason="restore turned off")
        self.start_iteration = self.restored.iteration
        self._adopt_slots()
        self._start_replicator()
        self._start_watchdog(model)
        if write_through_signal is not None:
            signal.signal(write_through_signal, lambda *_: self._write_through.set())
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
        self.group = dist.new_group(backend="gloo") if self.distributed and self.world > 1 else None
        self.nodes = self._gather([self.node]) if self.distributed else [[self.node]]
        self.node_of = [entry[0] for entry in self.nodes]
        self.next, self.prev = self._peers()
        self._own: list[_Slot | None] = [None] * self.slot_count
        self._replica: list[_Slot | None] = [None] * self.slot_count
        self._write_through = threading.Event()

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
        self._store = self._watch_store = None
        if self.distributed and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
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
        now = time.monotonic()
        self._intervals.append(now - self._last_step_at)
        self._last_step_at, self._last_iteration, self._synced = now, iteration, False
        self._beat("done", iteration)
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
        return f"{self.namespace}/{kind}/{owner}/{index}"

    def _slot_for(self, slots: list[_Slot | None], kind: str, owner: int, nbytes: int) -> tuple[int, _Slot]:
        """The slot to overwrite: the oldest (or empty) one, grown when the state no longer fits."""
        index = min(range(len(slots)), key=lambda i: -2 if slots[i] is None else slots[i].iteration)
        slot = slots[index]
        if slot is None or slot.size < nbytes:
            size = (int(nbytes * 1.1) // MiB + 1) * MiB
            key = self._key(kind, owner, index)
            fd = make_slot_fd(key, size)
            self.holder.register(key, fd, size)
            slot = slots[index] = _Slot(key, fd, size)
        return index, slot

    def _capture(self, iteration: int) -> _Slot:
        packed = packing.Packed(self.state_dict(iteration), iteration)
        _, slot = self._slot_for(self._own, "own", self.rank, packed.nbytes)
        self.holder.begin(slot.key)
        slot.iteration, slot.nbytes = -1, 0
        packed.write_into(slot.tensor)
        self.holder.commit(slot.key, self._meta(self.rank, iteration, packed.nbytes, "own"))
        slot.iteration, slot.nbytes = iteration, packed.nbytes
        self.snapshots_taken += 1
        return slot

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

    def _write_disk(self, slot: _Slot) -> str:
        folder = self._disk_folder(self.rank)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"iter{slot.iteration:012d}.snap")
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
            os.unlink(os.path.join(folder, f"iter{old:012d}.snap"))
        return path

    def _disk_iterations(self, rank: int) -> list[int]:
        if not self.checkpoint_dir or not os.path.isdir(self._disk_folder(rank)):
            return []
        found = []
        for name in os.listdir(self._disk_folder(rank)):
            if name.startswith("iter") and name.endswith(".snap"):
                path = os.path.join(self._disk_folder(rank), name)
                try:
                    with open(path, "rb") as handle:
                        iteration, total = packing.peek(handle.read(64))
                    if os.path.getsize(path) >= total:
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
        """Every rank's state from the newest iteration whose copies all survive in memory, else from the
        newest disk checkpoint every rank has, else nothing (``fresh``). Collective: every rank calls it."""
        started = time.perf_counter()
        by_iteration = self._snapshots_in_memory()
        chosen = next(
            (i for i in sorted(by_iteration, reverse=True) if len(by_iteration[i]) == self.world), None
        )
        if chosen is not None:
            return self._restore_snapshot(chosen, by_iteration[chosen], started)
        # No iteration every rank still has in memory.
        newest = max(by_iteration, default=None)
        reason = self._no_snapshot_reason(by_iteration, newest)
        self.holder.drop(f"{self.namespace}/")
        restored = self._restore_disk(reason, started)
        if restored is not None:
            return restored
        if newest is not None:
            log.warning("rank %d: %s and no disk checkpoint; starting afresh", self.rank, reason)
        return RestoreResult(
            "fresh",
            0,
            time.perf_counter() - started,
            reason=reason + ("" if newest is None else "; no disk checkpoint either"),
        )

    def _snapshots_in_memory(self) -> dict[int, dict[int, list[dict]]]:
        """Every rank's holder's copies of this world's snapshots: iteration -> owner rank -> copies."""
        mine = [
            dict(entry, holder=self.rank)
            for entry in self.holder.list(f"{self.namespace}/")
            if entry["meta"] and entry["meta"].get("world") == self.world
        ]
        everything = [entry for entries in self._gather(mine) for entry in entries]
        by_iteration: dict[int, dict[int, list[dict]]] = {}
        for entry in everything:
            meta = entry["meta"]
            by_iteration.setdefault(meta["iteration"], {}).setdefault(meta["owner"], []).append(entry)
        return by_iteration

    def _restore_snapshot(self, chosen: int, copies: dict[int, list[dict]], started: float) -> RestoreResult:
        """Restore iteration ``chosen`` from memory, each rank from its own copy where it survives."""
        sources = {
            owner: min(entries, key=lambda e: (e["holder"] != owner, e["holder"]))
            for owner, entries in copies.items()
        }
        state = self._fetch(sources)
        self.load_state_dict(state)
        self.holder.drop(f"{self.namespace}/", above=chosen)  # copies of a future that did not happen
        result = RestoreResult(
            "snapshot",
            chosen,
            time.perf_counter() - started,
            sum(s["meta"]["nbytes"] for s in sources.values()),
            {
                o: f"{'own copy' if s['holder'] == o else 'replica'} on {self.node_of[s['holder']]}"
                for o, s in sorted(sources.items())
            },
        )
        log.info(
            "rank %d restored iteration %d from %s in %.3fs",
            self.rank,
            chosen,
            result.sources[self.rank],
            result.seconds,
        )
        self._report(
            {
                "kind": "restore",
                "iteration": chosen,
                "seconds": round(result.seconds, 6),
                "bytes": result.bytes,
                "locations": [{"rank": o, "source": s} for o, s in sorted(result.sources.items())][:64],
            },
            rank0=True,
        )
        return result

    def _no_snapshot_reason(self, by_iteration: dict[int, dict[int, list[dict]]], newest: int | None) -> str:
        """Why no iteration can be restored from memory."""
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
        return reason

    def _restore_disk(self, reason: str, started: float) -> RestoreResult | None:
        """Restore the newest disk checkpoint every rank has; None where there is none."""
        disk = self._gather(sorted(self._disk_iterations(self.rank)))
        common = set(disk[0]).intersection(*map(set, disk[1:])) if disk else set()
        if not common:
            return None
        iteration = max(common)
        path = os.path.join(self._disk_folder(self.rank), f"iter{iteration:012d}.snap")
        with open(path, "rb") as handle:
            data = bytearray(handle.read())
        _, state = packing.unpack(data)
        self.load_state_dict(state)
        result = RestoreResult(
            "disk_fallback",
            iteration,
            time.perf_counter() - started,
            len(data),
            {r: "disk checkpoint" for r in range(self.world)},
            reason,
        )
        log.warning(
            "rank %d: %s; fell back to the disk checkpoint at iteration %d", self.rank, reason, iteration
        )
        self._report(
            {
                "kind": "disk_fallback",
                "iteration": iteration,
                "seconds": round(result.seconds, 6),
                "bytes": len(data),
                "note": reason,
                "locations": [{"rank": r, "source": "disk checkpoint"} for r in range(min(self.world, 64))],
            },
            rank0=True,
        )
        return result

    def _fetch(self, sources: dict[int, dict]) -> dict[str, Any]:
        """My state from its chosen copy: my own slot, or a replica that its holder rank sends me."""
        state = None
        for owner, source in sorted(sources.items()):
            holder_rank, nbytes = source["holder"], source["meta"]["nbytes"]
            if holder_rank == owner == self.rank:
                fd, size, _ = self.holder.open(source["key"])
                slot = _Slot(source["key"], fd, size)
                _, state = packing.unpack(slot.tensor[:nbytes])
                del slot
            elif holder_rank == self.rank:
                fd, size, _ = self.holder.open(source["key"])
                slot = _Slot(source["key"], fd, size)
                dist.send(slot.tensor[:nbytes], dst=owner, group=self.group)
                del slot
            elif owner == self.rank:
                buffer = torch.empty(nbytes, dtype=torch.uint8)
                dist.recv(buffer, src=holder_rank, group=self.group)
                _, state = packing.unpack(buffer)
        if state is None:
            raise RuntimeError(f"rank {self.rank}: no copy of its state arrived")
        return state

    def _adopt_slots(self) -> None:
        """Reuse the slots my node's holder already keeps for me (after a relaunch), newest iteration kept."""
        for slot in self.holder.list(f"{self.namespace}/"):
            parts = slot["key"].split("/")
            kind, owner, index = parts[-3], int(parts[-2]), int(parts[-1])
            slots = (
                self._own
                if (kind, owner) == ("own", self.rank)
                else self._replica
                if (kind, owner) == ("replica", self.prev)
                else None
            )
            if slots is None or index >= len(slots):
                continue
            fd, size, meta = self.holder.open(slot["key"])
            slots[index] = _Slot(
                slot["key"], fd, size, meta["iteration"] if meta else -1, meta["nbytes"] if meta else 0
            )

    # --- the watchdog -------------------------------------------------------------------------------------
    def _beat_store(self):
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=30),
        )
        return dist.PrefixStore(f"lockstep-protect/{self.namespace}/", store)

    def _beat(self, phase: str, iteration: int) -> None:
        if self._store is not None:
            try:
                self._store.set(f"beat/{self.rank}", f"{iteration}:{phase}:{time.time():.3f}")
            except Exception as error:  # the store went with rank 0's node; the relaunch will follow
                log.debug("beat failed: %s", error)

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

    def _stalled(self) -> tuple[list[int], str]:
        if self._watch_store is None:
            mine = "before" if not self._synced else "in"
            return ([self.rank] if not self._synced else []), f"rank {self.rank} is {mine} its gradient sync"
        beats = {}
        for rank in range(self.world):
            try:
                iteration, phase, _ = self._watch_store.get(f"beat/{rank}").decode().split(":")
                beats[rank] = (int(iteration), phase)
            except Exception:
                beats[rank] = (-1, "gone")
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
        if len(late) < self.world:
            return late, f"rank(s) {', '.join(map(str, late))} are behind at iteration {lowest}"
        return [], "no rank has reached the gradient sync; cannot tell which stalled"

    def _watch_loop(self) -> None:
        while not self._closed.wait(0.2):
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
            stalled, detail = self._stalled()
            report = HangReport(
                self._last_iteration, round(waited, 3), round(usual, 4), stalled, self.rank, detail
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
