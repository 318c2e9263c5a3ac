"""Who the job's processes are, in place: N active ranks and S standbys in one Slurm allocation, and the
re-forming of the job's process group with a standby in a lost rank's place, without relaunching the survivors.

    membership = Membership(member=SLURM_PROCID, active=N, node=..., job=..., host=MASTER_ADDR, port=MASTER_PORT)
    if membership.is_standby:
        rank = membership.wait_for_assignment()          # None: the job ended, or fell back
    membership.init_process_group(rank)                  # gloo, this generation's store prefix

Every process is a *member* (its ``SLURM_PROCID``): members 0..N-1 start as ranks 0..N-1, the others are standbys
(torch imported, joined to the job's store, holding no state, heartbeating). Member 0 hosts the store (a
``TCPStore``) and is rank 0 in every generation: it leads. When a collective fails, each survivor posts what it
can restore (``fail``); the leader waits until every active rank has either posted or gone silent (its heartbeat
older than ``lost_after``), names the lost ranks, picks one live standby per lost rank and the newest iteration
every rank can restore (a lost rank from its replica on the peer node), and writes the plan for generation g+1;
the process group is then re-formed under the new generation's store prefix. When it cannot be done in place it
says why (``Fallback``): no standby left, both copies of a lost rank's state gone, or the store host (rank 0's
node) lost; the job then exits and takes today's path (requeue, restore from memory or disk).

**What keeps a Slurm job and its step alive when one node dies** (verified on the test Slurm,
``jobs.local_slurm``: three nodes, a node's slurmd, step daemon and task killed at once):

- ``sbatch --no-kill``: the allocation survives its node's failure; the job stays RUNNING and, once the node is
  declared down (``SlurmdTimeout`` later), the node is dropped from the job's node list (``n[1-3]`` → ``n[1,3]``).
- ``srun --no-kill``: the step survives too (``srun: error: Node failure on n2``, the other tasks go on). Without
  it srun force-terminates the whole step when the node is declared down (the survivors killed, exit 137,
  ~20 s after the node died with ``SlurmdTimeout=10``).
- ``srun --kill-on-bad-exit=0``: a task that dies alone (its node alive) does not end the step either (with ``=1``,
  as the requeue path runs, it would).

So an in-place job runs ``sbatch --no-kill ...`` and ``srun --no-kill --kill-on-bad-exit=0`` (train_slurm.sh does
with ``--standbys``).

A standby must prove it is the job's before it is given a rank: its member record and its heartbeats carry a tag
made with the job's heartbeat key (``key``, from the job's protection secret, ``protect.keys``), which the leader
checks; whoever merely reaches the job's store cannot pass for one (at worst, by deleting keys, make the job fall
back).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger("lockstep_agent.protect.membership")

COLLECTIVE_TIMEOUT_ENV = "LOCKSTEP_PROTECT_COLLECTIVE_TIMEOUT"
STORE_HOST_LOST = (
    "store host lost"  # a fallback's reason when rank 0's node, which hosts the job's store, is gone
)


class Fallback(RuntimeError):
    """The lost rank cannot be replaced in place; ``reason`` says why (the job exits and takes today's path)."""

    def __init__(self, reason: str, plan: Plan | None = None):
        super().__init__(reason)
        self.reason, self.plan = reason, plan


@dataclass
class Plan:
    """The leader's decision after a failure in generation ``generation - 1``."""

    generation: int
    members: list[int]  # the member that is each rank in the new generation
    lost_ranks: list[int] = field(default_factory=list)
    lost_nodes: list[str] = field(default_factory=list)
    to_nodes: list[str] = field(default_factory=list)
    reached: int = 0  # the highest iteration any rank completed before the fault
    fault_at: float = 0.0  # when the first survivor noticed
    survivor_pids: dict[str, int] = field(default_factory=dict)
    standbys_left: list[str] = field(default_factory=list)
    detail: str = ""
    fallback: str = ""  # why it cannot be done in place ('' when it can)


def collective_timeout() -> float:
    """Seconds any collective may take before it counts as failed (``LOCKSTEP_PROTECT_COLLECTIVE_TIMEOUT``)."""
    return float(os.environ.get(COLLECTIVE_TIMEOUT_ENV) or 10.0)


class Membership:
    def __init__(
        self,
        *,
        member: int,
        active: int,
        node: str,
        job: str,
        host: str,
        port: int,
        timeout: float | None = None,
        lost_after: float = 1.5,
        beat_every: float = 0.2,
        connect_timeout: float = 300.0,
        key: bytes | None = None,
    ):
        self.active, self.node, self.job = active, node, job
        # The job's heartbeat key: a standby proves itself with it; the leader's is set once the runtime has it.
        self.key = key
        self._unproven: set[int] = set()
        self.timeout = timeout if timeout is not None else collective_timeout()
        self.lost_after, self.beat_every = lost_after, beat_every
        self.generation, self.members = 0, list(range(active))
        self.iteration = 0  # the last iteration this member completed (the runtime sets it)
        self.standby_nodes: list[str] = []  # live standbys' nodes, as the heartbeat thread last saw them
        self.plan: Plan | None = None  # the plan that made this process what it is now (None: generation 0)
        self.host, self.port, self._connect_timeout = host, port, connect_timeout
        self._base = dist.TCPStore(
            host,
            port,
            is_master=member == 0,
            wait_for_workers=False,
            timeout=timedelta(seconds=connect_timeout),
        )
        self.store = dist.PrefixStore(f"lockstep-protect/{job}/", self._base)
        # A standby started later (member -1) takes the next member number.
        self.member = member if member >= 0 else self.store.add("members", 1) - 1
        record = {"node": node, "pid": os.getpid()}
        self.store.set(f"member/{self.member}", json.dumps({**record, "tag": self._tag("member", record)}))
        self._stopped = threading.Event()
        self._beat_once(self.store)
        self._beater = threading.Thread(target=self._beat_loop, name="lockstep-protect-alive", daemon=True)
        self._beater.start()

    @property
    def is_standby(self) -> bool:
        return self.member not in self.members

    @property
    def rank(self) -> int | None:
        return self.members.index(self.member) if self.member in self.members else None

    # --- heartbeats ----------------------------------------------------------------------------------------
    def _tag(self, what: str, value, member: int | None = None) -> str:
        """``value`` of ``member`` (this one's by default) tagged with the job's heartbeat key ('' without it)."""
        if self.key is None:
            return ""
        member = self.member if member is None else member
        message = f"lockstep-standby/1\0{self.job}|{member}|{what}|{json.dumps(value, sort_keys=True)}"
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()[:32]

    def _beat_once(self, store) -> None:
        value = f"{time.time():.3f}:{self.iteration}"
        store.set(f"alive/{self.member}", f"{value}:{self._tag('alive', value)}")

    def _beat_loop(self) -> None:
        try:
            own = dist.PrefixStore(
                f"lockstep-protect/{self.job}/",
                dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=self.timeout)),
            )
        except Exception as error:  # the store host is gone
            log.warning("member %d: no heartbeat store: %s", self.member, error)
            return
        while not self._stopped.wait(self.beat_every):
            try:
                self._beat_once(own)
                if self.member == 0:
                    self.standby_nodes = [self._node_of(own, m) for m in self._live_standbys(own)]
            except Exception as error:
                log.debug("member %d: heartbeat failed: %s", self.member, error)

    def _age(self, store, member: int) -> tuple[float, int]:
        """Seconds since ``member`` last beat (inf: never), and the iteration it said it had completed."""
        key = f"alive/{member}"
        if not store.check([key]):
            return float("inf"), -1
        at, iteration, _ = store.get(key).decode().split(":", 2)
        return time.time() - float(at), int(iteration or -1)

    def _proven(self, store, member: int) -> bool:
        """Whether ``member``'s record and newest heartbeat carry the job's tag (the leader's check of a standby)."""
        if self.key is None:
            return False
        record = json.loads(store.get(f"member/{member}"))
        tag = record.pop("tag", "")
        at, iteration, beat_tag = store.get(f"alive/{member}").decode().split(":", 2)
        return hmac.compare_digest(tag, self._tag("member", record, member)) and hmac.compare_digest(
            beat_tag, self._tag("alive", f"{at}:{iteration}", member)
        )

    def _node_of(self, store, member: int) -> str:
        return json.loads(store.get(f"member/{member}"))["node"]

    def _total(self, store) -> int:
        return int(store.get("members")) if store.check(["members"]) else self.active

    def _live_standbys(self, store, exclude=()) -> list[int]:
        found = []
        for member in range(self._total(store)):
            if member in self.members or member in exclude or store.check([f"used/{member}"]):
                continue
            if store.check([f"member/{member}"]) and self._age(store, member)[0] < self.lost_after:
                if self._proven(store, member):
                    found.append(member)
                elif self.key is not None and member not in self._unproven:
                    self._unproven.add(member)
                    log.warning("member %d: not proven to be the job's (no tag of its key)", member)
        return found

    def announce_total(self, total: int) -> None:
        """Member 0 says how many members the allocation has (active + standbys)."""
        self.store.set("members", str(total))

    # --- process groups ------------------------------------------------------------------------------------
    def init_process_group(self, rank: int) -> None:
        """Join this generation's gloo process group as ``rank``; every collective bounded by ``timeout``."""
        store = dist.PrefixStore(f"g{self.generation}/pg/", self.store)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=self.active,
            timeout=timedelta(seconds=max(self.timeout, 1.0)),
        )

    def reform(self) -> None:
        """Leave the broken process group and join the new generation's, keeping this process's rank."""
        try:
            dist.destroy_process_group()
        except Exception as error:  # already half gone with its peer
            log.debug("destroying the old process group: %s", error)
        self.init_process_group(self.rank)

    # --- the fault ---------------------------------------------------------------------------------------
    def fail(self, rank: int, status: dict, on_lost=None) -> Plan:
        """Say this rank saw generation g's collectives fail, with what it can restore (``status``: iteration,
        own, replicas, at, detail); returns the plan for g+1 once the leader made it. Raises ``Fallback`` when the
        job cannot go on in place. The leader calls ``on_lost(plan)`` as soon as it knows who was lost."""
        generation = self.generation
        try:
            self.store.set(f"g{generation}/failed/{rank}", json.dumps({**status, "pid": os.getpid()}))
            if rank == 0:
                plan = self._decide(generation, on_lost)
                self.store.set(f"g{generation}/plan", json.dumps(asdict(plan)))
                self.store.set("gen", str(plan.generation))
            else:
                self.store.wait([f"g{generation}/plan"], timedelta(seconds=self.timeout + 30))
                plan = Plan(**json.loads(self.store.get(f"g{generation}/plan")))
        except Fallback:
            raise
        except Exception as error:
            raise Fallback(f"{STORE_HOST_LOST} ({type(error).__name__}: {str(error)[:200]})") from error
        if plan.fallback:
            raise Fallback(plan.fallback, plan)
        if self.member not in plan.members:
            raise Fallback(f"rank {rank} was given up for lost by the leader", plan)
        self.generation, self.members, self.plan = plan.generation, plan.members, plan
        return plan

    def _posted(self, generation: int) -> dict[int, dict]:
        keys = {r: f"g{generation}/failed/{r}" for r in range(self.active)}
        return {r: json.loads(self.store.get(k)) for r, k in keys.items() if self.store.check([k])}

    def _decide(self, generation: int, on_lost) -> Plan:
        deadline = time.monotonic() + self.timeout + self.lost_after + 5
        while True:
            posted = self._posted(generation)
            silent = {
                r: self._age(self.store, self.members[r]) for r in range(self.active) if r not in posted
            }
            lost = sorted(r for r, (age, _) in silent.items() if age > self.lost_after)
            if len(posted) + len(lost) == self.active or time.monotonic() > deadline:
                lost = sorted(set(range(self.active)) - set(posted))
                break
            time.sleep(0.05)
        reached = max([p["iteration"] for p in posted.values()] + [it for _, it in silent.values()])
        plan = Plan(
            generation + 1,
            list(self.members),
            lost_ranks=lost,
            lost_nodes=[self._node_of(self.store, self.members[r]) for r in lost],
            reached=reached,
            fault_at=min(p["at"] for p in posted.values()),
            survivor_pids={str(r): p["pid"] for r, p in sorted(posted.items())},
            detail=posted[0]["detail"],
        )
        if on_lost is not None:
            on_lost(plan)
        plan.fallback = self._why_not_in_place(plan, posted)
        if not plan.fallback:
            standbys = self._live_standbys(self.store)
            for rank, member in zip(lost, standbys, strict=False):
                plan.members[rank] = member
                self.store.set(f"used/{member}", "1")
            plan.to_nodes = [self._node_of(self.store, plan.members[r]) for r in lost]
            left = [m for m in standbys if m not in plan.members]
            plan.standbys_left = [self._node_of(self.store, m) for m in left]
        log.warning(
            "generation %d: lost rank(s) %s on %s; %s",
            generation,
            lost,
            plan.lost_nodes,
            plan.fallback or f"replaced by {plan.to_nodes}",
        )
        return plan

    def _why_not_in_place(self, plan: Plan, posted: dict[int, dict]) -> str:
        """Why the lost ranks cannot be replaced in place ('' when they can): both copies of one's state gone
        (its own went with its node; its replica is with its peer), or too few live standbys."""
        if not plan.lost_ranks:
            return "no rank was lost, yet the collective failed"
        for rank, node in zip(plan.lost_ranks, plan.lost_nodes, strict=True):
            if not any(p.get("replicas", {}).get(str(rank)) for p in posted.values()):
                return f"both copies of rank {rank} lost (its own on {node}, its replica with its peer)"
        standbys = self._live_standbys(self.store)
        if len(standbys) < len(plan.lost_ranks):
            return (
                f"no standby left for rank(s) {', '.join(map(str, plan.lost_ranks))} "
                f"({len(standbys)} live standby(s) for {len(plan.lost_ranks)} lost)"
            )
        return ""

    # --- standbys ------------------------------------------------------------------------------------------
    def wait_for_assignment(self, poll: float = 0.1) -> int | None:
        """A standby waits to be given a lost rank's number: that rank, or None when the job ended or fell back
        (or its store host went)."""
        seen = 0
        while True:
            try:
                if self.store.check(["done"]):
                    return None
                current = int(self.store.get("gen")) if self.store.check(["gen"]) else 0
                while seen < current:
                    plan = Plan(**json.loads(self.store.get(f"g{seen}/plan")))
                    seen += 1
                    if plan.fallback:
                        return None
                    if self.member in plan.members:
                        self.generation, self.members, self.plan = plan.generation, plan.members, plan
                        return self.rank
                    self.generation, self.members = plan.generation, plan.members
            except Exception as error:
                log.warning("standby %d: the job's store is gone (%s); leaving", self.member, error)
                return None
            time.sleep(poll)

    def finish(self, wait: float = 3.0) -> None:
        """The job ended: tell the standbys (member 0 keeps the store up a moment so they hear it)."""
        try:
            self.store.set("done", "1")
        except Exception:
            return
        if self.member == 0:
            time.sleep(min(wait, 5 * self.beat_every))
        self.close()

    def close(self) -> None:
        self._stopped.set()
