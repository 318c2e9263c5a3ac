"""What the benchmarks read from /proc: a process's parent, group and CPU time, and processes by name."""

import os
from pathlib import Path
from typing import NamedTuple

TICKS = os.sysconf("SC_CLK_TCK")


class Stat(NamedTuple):
    ppid: int
    pgid: int
    cpu: float  # user + system seconds
    reaped_cpu: float  # user + system seconds of the children it has waited for


def proc_stat(pid: int) -> Stat | None:
    """A process's /proc/<pid>/stat figures, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return Stat(
        int(fields[1]),
        int(fields[2]),
        (int(fields[11]) + int(fields[12])) / TICKS,
        (int(fields[13]) + int(fields[14])) / TICKS,
    )


def pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def named(name: str) -> list[int]:
    """The processes whose command is ``name`` (postgres, redis-server)."""
    found = []
    for pid in pids():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.append(pid)
        except OSError:
            continue
    return found


def group_cpu(pgid: int) -> float:
    """CPU seconds of every live process in a process group."""
    return sum(stat.cpu for stat in map(proc_stat, pids()) if stat and stat.pgid == pgid)


def cpu_by_pid(found: list[int]) -> dict[int, float]:
    """CPU seconds of each of these processes that is still there."""
    return {pid: stat.cpu for pid in found if (stat := proc_stat(pid))}


def cpu_used_since(before: dict[int, float], name: str) -> float:
    """CPU seconds the ``name`` processes used since ``before`` (``cpu_by_pid(named(name))`` then): those started
    meanwhile count whole, those that exited meanwhile are not counted (never negative)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in cpu_by_pid(named(name)).items())
