"""What fleet asks of apps that import it (jobs), without importing them: registered in their AppConfig.ready().

- ``fault_counter(cluster_ids, since, until) -> int``: how many hardware faults a node-level change can cause
  (one per incident) those clusters' nodes had in a time window. The rollout gate (fleet/gate.py) compares a
  batch's count after the change with the count before it, scaled by node-hours.
- ``drain_guard(node) -> tuple[bool, str]``: may this node be drained now without interrupting a protected
  job that cannot be migrated first? A node-software rollout waits (or moves the job) while it says no.
- ``drain_started(node_ids)``: these nodes were just set draining (committed): their jobs are to be moved off
  (jobs.services.drain); called after COMMIT by the node services.
"""

from collections.abc import Callable
from datetime import datetime

_fault_counter: Callable[[list[int], datetime, datetime], int] | None = None
_drain_guard: Callable[[object], tuple[bool, str]] | None = None
_node_reason: Callable[[object], str] | None = None
_slurm_job_of: Callable[[str], str | None] | None = None
_drain_started: Callable[[list[int]], None] | None = None


def register_drain_started(callback: Callable[[list[int]], None]) -> None:
    global _drain_started
    _drain_started = callback


def drain_started(node_ids: list[int]) -> None:
    """Nothing happens until the jobs app registers what a drain sets in motion."""
    if _drain_started and node_ids:
        _drain_started(node_ids)


def register_node_reason(reason: Callable[[object], str]) -> None:
    """``reason(node) -> str``: what a driver writes as a node's drain reason (its open incident), '' for none."""
    global _node_reason
    _node_reason = reason


def register_slurm_job_of(resolver: Callable[[str], str | None]) -> None:
    """``resolver(job_ref) -> str | None``: the Slurm job id of a Lockstep job (the Slurm driver asks)."""
    global _slurm_job_of
    _slurm_job_of = resolver


def node_reason(node) -> str:
    return _node_reason(node) if _node_reason else ""


def slurm_job_of(job_ref: str) -> str | None:
    return _slurm_job_of(job_ref) if _slurm_job_of else None


def register_fault_counter(counter: Callable[[list[int], datetime, datetime], int]) -> None:
    global _fault_counter
    _fault_counter = counter


def register_drain_guard(guard: Callable[[object], tuple[bool, str]]) -> None:
    global _drain_guard
    _drain_guard = guard


def count_faults(cluster_ids: list[int], since: datetime, until: datetime) -> int:
    """Hardware faults on these clusters' nodes in [since, until); 0 until the jobs app registers its counter."""
    return _fault_counter(cluster_ids, since, until) if _fault_counter else 0


def may_drain(node) -> tuple[bool, str]:
    """(True, "") when nothing registered objects."""
    return _drain_guard(node) if _drain_guard else (True, "")
