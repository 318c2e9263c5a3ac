"""Which tests start extra processes: the ``slow`` mark, which ``make test-fast`` leaves out.

A test is slow when it starts a process: uvicorn, Celery, redis-server, PostgreSQL, Chromium, Slurm, Prometheus,
torch, ``manage.py``, any program. ``slow_items`` finds them at collection by reading code: the test's own, its
fixtures', and the test-support functions and classes they name, down to what starts a process (the subprocess
and multiprocessing modules, Playwright, ``os.fork``…). A mark set by hand stays. ``ProcessWatch`` checks at run
time what the reading missed (a program started by product code, say): a test not marked slow that starts a
process fails at teardown and says to mark it, so the fast tier stays free of processes.
"""

import importlib
import inspect
import os
import subprocess
import sys
import threading
import types

# Code that starts processes: these modules (and what they define), and these functions of ``os``.
STARTERS = (
    "subprocess",
    "multiprocessing",
    "asyncio.subprocess",
    "concurrent.futures.process",
    "playwright",
    "_posixsubprocess",
)
OS_STARTERS = {
    "fork",
    "forkpty",
    "system",
    "popen",
    "posix_spawn",
    "posix_spawnp",
    "execv",
    "execve",
    "execvp",
}
# What libraries run for a moment while importing (ctypes.util.find_library asks ldconfig, gcc, objdump): not a
# process a test starts.
PROBES = {"ldconfig", "gcc", "cc", "objdump", "ld", "uname"}
# Code read further: the suite's, and the test-support code it shares with the product and the agent (the local
# Slurm, the protection runtime's multi-process harness).
OURS = ("tests", "conftest", "jobs.local_slurm", "controlplane.testing", "lockstep_agent.protect.testing")


def _module_name(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return getattr(obj, "__module__", None) or ""


def _within(name: str, prefixes) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


class _Reader:
    """Reads code objects and what they name, remembering what it has read (code refers to itself)."""

    def __init__(self):
        self.verdicts: dict[int, bool] = {}

    def starts_process(self, obj) -> bool:
        if isinstance(obj, types.FunctionType):
            obj = inspect.unwrap(obj)  # @contextmanager and friends keep the function as __wrapped__
        key = id(obj)
        if key not in self.verdicts:
            self.verdicts[key] = False  # while reading it: a cycle says nothing new
            self.verdicts[key] = self._judge(obj)
        return self.verdicts[key]

    def _judge(self, obj) -> bool:
        name = _module_name(obj)
        if _within(name, STARTERS):
            return True
        if isinstance(obj, types.ModuleType) or not _within(name, OURS):
            return False
        if isinstance(obj, type):
            members = [
                member
                for klass in obj.__mro__
                if _within(klass.__module__, OURS)
                for member in vars(klass).values()
            ]
            return any(self._member_starts(member) for member in members)
        if isinstance(obj, types.FunctionType):
            return self.code_starts(obj.__code__, obj.__globals__)
        return False

    def _member_starts(self, member) -> bool:
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property):
            return any(self.starts_process(part) for part in (member.fget, member.fset) if part)
        return isinstance(member, types.FunctionType) and self.starts_process(member)

    def code_starts(self, code: types.CodeType, namespace: dict) -> bool:
        names = set(code.co_names)
        for name in names:
            if name not in namespace and _within(name, STARTERS):  # import subprocess, inside a function
                return True
            found = namespace.get(name)
            if found is None and _within(name, OURS):  # a module of ours a function imports for itself
                found = sys.modules.get(name) or _import(name)
            if found is None:
                continue
            if found is os and names & OS_STARTERS:
                return True
            if isinstance(found, types.ModuleType):
                if _within(found.__name__, STARTERS):
                    return True
                if _within(found.__name__, OURS):  # module.function(...), or from module import function
                    if any(
                        self.starts_process(getattr(found, other)) for other in names if hasattr(found, other)
                    ):
                        return True
                continue
            if self.starts_process(found):
                return True
        nested = (const for const in code.co_consts if isinstance(const, types.CodeType))
        return any(self.code_starts(inner, namespace) for inner in nested)


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:  # a name in co_names that only looks like a module
        return None


def slow_items(items) -> list:
    """The collected tests that start a process, by their code, their class's and their fixtures'."""
    reader = _Reader()
    found = []
    for item in items:
        function = getattr(item, "function", None)
        parts = [function] if function is not None else []
        if getattr(item, "cls", None) is not None:
            parts.append(item.cls)
        fixture_info = getattr(item, "_fixtureinfo", None)
        for name in getattr(item, "fixturenames", ()):
            for definition in fixture_info.name2fixturedefs.get(name, ()) if fixture_info else ():
                parts.append(definition.func)
        if any(reader.starts_process(part) for part in parts if part is not None):
            found.append(item)
    return found


class ProcessWatch:
    """Counts the processes a test starts (``subprocess.Popen``, which Playwright and asyncio use too, and
    ``os.fork``): from the main thread while it runs, or from a thread it started. A thread an earlier test left
    behind (a pool still replaying a what-if) starts processes in the name of that test, not the current one."""

    def __init__(self):
        self.started: list[str] = []
        self.current: str | None = None
        # Setting up a fixture built once per module or session (the permission matrix's world runs one what-if,
        # a replay in a process of its own): paid once per worker, not by each test; not counted.
        self.shared_fixture = False
        self._lock = threading.Lock()

    def install(self) -> None:
        watch = self
        original_init, original_start = subprocess.Popen.__init__, threading.Thread.start

        def counting_init(self, args, *rest, **options):
            watch.note(args)
            original_init(self, args, *rest, **options)

        def stamped_start(self, *rest, **options):
            self.lockstep_test = watch.current
            return original_start(self, *rest, **options)

        subprocess.Popen.__init__ = counting_init
        threading.Thread.start = stamped_start
        os.register_at_fork(before=lambda: watch.note("fork"))

    def note(self, what) -> None:
        program = what[0] if isinstance(what, list | tuple) and what else what
        if os.path.basename(str(program)) in PROBES:
            return
        thread = threading.current_thread()
        owner = self.current if thread is threading.main_thread() else getattr(thread, "lockstep_test", None)
        if owner is not None and owner == self.current and not self.shared_fixture:
            with self._lock:
                self.started.append(" ".join(map(str, what)) if isinstance(what, list | tuple) else str(what))

    def begin(self, test: str) -> None:
        self.started, self.current = [], test

    def end(self) -> list[str]:
        self.current = None
        return self.started
