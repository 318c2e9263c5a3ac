"""What fleet asks of apps that import it (jobs), without importing them: registered in their AppConfig.ready().

- ``fault_counter(cluster_ids, since, until) -> int``: how many hardware faults a node-level change can cause
  (one per incident) those clusters' nodes had in a time window. The rollout gate (fleet/gate.py) compares a
  batch's count after the change with the count before it, scaled by node-hours.
- ``drain_guard(node) -> tuple[bool, str]``: may this node be drained now without interrupting a protected
  job that cannot be migrated first? A node-software rollout waits (or moves the job) while it says no.
"""

from collections.abc import Callable
from datetime import datetime

_fault_counter: Callable[[list[int], datetime, datetime], int] | None = None
_drain_guard: Callable[[object], tuple[bool, str]] | None = None


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
