"""Logging filters that keep the log to what a reader acts on (settings.LOGGING installs them).

- ``RoutineTasksAtDebug``: beat sends its routine tasks every few seconds; their "Sending due task", "received"
  and "succeeded" lines are DEBUG records, not INFO, so a worker at INFO logs the faults it handles, not the
  sweeps it ran. A routine task that fails still logs its error; LOG_ROUTINE_TASKS keeps them at INFO.
- ``ClientErrorsOnOneLine``: a refused request (403, 404 and the other 4xx answers) is the client's mistake,
  not the server's: one line, without the traceback Django attaches to a PermissionDenied or Http404.
"""

import logging

from django.conf import settings

# Queued by a routine sweep for each object it finds, every tick: the step of each running rollout.
SWEPT_TASKS = frozenset({"fleet.rollout_progress"})


def routine_tasks() -> frozenset[str]:
    """The names of the tasks beat sends on a schedule, and of those its sweeps queue every tick."""
    return frozenset(entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()) | SWEPT_TASKS


def _task_names(record: logging.LogRecord) -> set[str]:
    """The task names a Celery record carries: beat's send (celery.beat; args: entry name, task name), a worker
    discarding an expired message (celery.worker.request; args: name, id), the worker's receipt and success
    (celery.worker.strategy, celery.app.trace; args: a dict with the task's name)."""
    args = record.args
    if isinstance(args, dict):
        return {args.get("name")}
    if isinstance(args, tuple):
        return {value for value in args if isinstance(value, str)}
    return set()


class RoutineTasksAtDebug(logging.Filter):
    """Turn the send, receipt and success records of beat's routine tasks into DEBUG records."""

    def __init__(self, name: str = ""):
        super().__init__(name)
        self._routine: frozenset[str] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or settings.LOG_ROUTINE_TASKS:
            return True
        if self._routine is None:
            self._routine = routine_tasks()
        if not _task_names(record) & self._routine:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class ClientErrorsOnOneLine(logging.Filter):
    """Drop the traceback of a request answered with a 4xx: the status line says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and 400 <= status < 500:
            record.exc_info, record.exc_text = None, None
        return True
