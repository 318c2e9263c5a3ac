"""The protection runtime's in-place recovery (``Protection.recover``): a lost rank replaced by a standby of the
allocation while the survivors keep their processes, model and optimizer; ``membership`` says who decides what.

Reports to Lockstep (``POST /api/v1/jobs/<id>/snapshots/``, sent at once, never coalesced), from rank 0:

- ``peer_lost`` as soon as the leader knows which ranks were lost (iteration, at, lost_ranks, lost_nodes, detail,
  generation);
- ``rank_replaced`` after the first step completed in the new generation (the resumed-from iteration, at, fault_at,
  lost_ranks, from_nodes, to_nodes, lost_iterations, reached, generation, standbys_left, survivor_pids, seconds,
  bytes, standbys, active_nodes);
- ``standbys`` and ``active_nodes`` in every restore-point report;
- a fallback's reason (no standby left, both copies of a rank lost, store host lost) in the relaunch's ``restore``
  or ``disk_fallback`` report as ``reason`` (kept meanwhile in ``<checkpoint_dir>/<job>/fallback.json``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable

from lockstep_agent.protect.membership import STORE_HOST_LOST, Fallback, Plan

log = logging.getLogger("lockstep_agent.protect")

FALLBACK_FILE = "fallback.json"


class PeerLost(RuntimeError):
    """A peer's loss seen by the replication thread, raised into the training loop at the next step."""


class InPlaceRecovery:
    """Mixed into ``Protection``: what a survivor does when the job's collectives fail."""

    events: list[dict]

    def recover(self, error: BaseException, rebuild: Callable[[], object]):
        """Call from the training loop when a step raised (a collective failed): agree with the others on who was
        lost, re-form the process group with a standby in its place and restore every rank to the newest
        iteration all can restore (``start_iteration``). ``rebuild()`` wraps the kept model anew for the new
        process group (e.g. a new DistributedDataParallel around the same module); returns what it returned.
        Raises ``Fallback`` (with the reason) when it cannot be done in place, ``error`` without a membership."""
        if self.membership is None:
            raise error
        noticed = time.time()
        log.error("rank %d: collective failed at iteration %d: %s", self.rank, self._last_iteration, error)
        self._stop_generation()
        status = {
            "iteration": self._last_iteration,
            "at": noticed,
            "detail": str(error)[:500],
            "node": self.node,
            "own": sorted(s.iteration for s in self._own if s is not None and s.nbytes),
            "replicas": {
                str(self.prev): sorted(s.iteration for s in self._replica if s is not None and s.nbytes)
            },
        }
        try:
            plan = self.membership.fail(self.rank, status, on_lost=self._report_lost)
        except Fallback as fallback:
            self._fell_back(fallback.reason)
            raise
        self.membership.reform()
        self.model = rebuild()
        self._in_place = True
        self._begin(restore=True)
        self._replaced = {"plan": plan, "noticed": noticed}
        log.warning(
            "rank %d: generation %d: rank(s) %s replaced on %s; resuming from iteration %d",
            self.rank,
            plan.generation,
            plan.lost_ranks,
            plan.to_nodes,
            self.start_iteration,
        )
        return self.model

    def _stop_generation(self) -> None:
        """End this generation's replication and watchdog threads (their collectives are bounded)."""
        self._closed.set()
        self._rounds.put(None)
        self._replicator.join(timeout=self.membership.timeout + 5)
        if self._replicator.is_alive():
            log.warning("rank %d: the replication thread is still in a collective", self.rank)
        self.error = None  # this generation's; the next one starts clean

    def _raise_peer_loss(self) -> None:
        if self.membership is not None and self.error is not None:
            error, self.error = self.error, None
            raise PeerLost(f"replication failed: {error}")

    def _after_step(self, iteration: int) -> None:
        if self.membership is None:
            return
        self.membership.iteration = iteration
        if self._replaced is None:
            return
        replaced, self._replaced = self._replaced, None
        plan: Plan = replaced["plan"]
        at = time.time()
        body = {
            "kind": "rank_replaced",
            "iteration": self.start_iteration,
            "at": round(at, 3),
            "fault_at": round(plan.fault_at, 3),
            "lost_ranks": plan.lost_ranks,
            "from_nodes": plan.lost_nodes,
            "to_nodes": plan.to_nodes,
            "lost_iterations": max(0, plan.reached - self.start_iteration),
            "reached": plan.reached,
            "generation": plan.generation,
            "standbys_left": plan.standbys_left,
            "survivor_pids": plan.survivor_pids,
            "seconds": round(at - plan.fault_at, 3),
            "bytes": self.restored.bytes,
            **self._allocation(),
        }
        self._event(body)

    def _report_lost(self, plan: Plan) -> None:
        self._event(
            {
                "kind": "peer_lost",
                "iteration": self._last_iteration,
                "at": round(plan.fault_at, 3),
                "lost_ranks": plan.lost_ranks,
                "lost_nodes": plan.lost_nodes,
                "detail": plan.detail[:500],
                "generation": plan.generation - 1,
            }
        )

    def _event(self, body: dict) -> None:
        """An in-place report: kept (``events``), logged, and sent by rank 0."""
        self.events.append(body)
        log.warning("rank %d: %s", self.rank, json.dumps(body))
        self._report(body, rank0=True)

    def _allocation(self) -> dict:
        """Rank 0's view of the allocation for its reports: live standbys' nodes and the active ranks' nodes."""
        if self.membership is None or self.rank != 0:
            return {}
        return {"standbys": list(self.membership.standby_nodes), "active_nodes": list(self.node_of)}

    def _fallback_path(self) -> str | None:
        if not self.checkpoint_dir:
            return None
        return os.path.join(self.checkpoint_dir, self.namespace, FALLBACK_FILE)

    def _fell_back(self, reason: str) -> None:
        """Rank 0 keeps the reason for the relaunch's report (which says which fallback and why); when rank 0's
        node is the one lost (the store host), the survivors do, each writing the whole file at once."""
        log.error("rank %d: cannot replace in place: %s; falling back to a relaunch", self.rank, reason)
        self.events.append({"kind": "fallback", "reason": reason, "at": round(time.time(), 3)})
        path = self._fallback_path()
        if path and (self.rank == 0 or reason.startswith(STORE_HOST_LOST)):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{self.rank}.tmp"
            with open(partial, "w") as out:
                json.dump({"reason": reason, "at": time.time()}, out)
            os.replace(partial, path)

    def _fallback_reason(self) -> dict:
        """``{"reason": ...}`` when the previous launch fell back (said once, by rank 0), else ``{}``."""
        path = self._fallback_path()
        if self.rank != 0 or not path or not os.path.exists(path):
            return {}
        try:
            with open(path) as handle:
                reason = json.load(handle)["reason"]
            os.unlink(path)
        except (OSError, ValueError, KeyError):
            return {}
        return {"reason": f"in-place replacement impossible: {reason}"[:1000]}
