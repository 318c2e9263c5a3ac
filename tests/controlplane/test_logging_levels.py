"""The log says what a reader acts on: beat's routine tasks at DEBUG, a refused request on one line, once."""

import io
import logging

import pytest
from django.conf import settings
from django.test import override_settings

from controlplane.logging_filters import RoutineTasksAtDebug, routine_tasks
from tenancy.choices import Role
from tests.support.factories import make_tenant, make_user


def celery_records():
    """The records Celery makes for a task sent by beat, received and succeeded, by logger name."""

    def received(name):
        return ("celery.worker.strategy", "Task %(name)s[%(id)s] received", ({"name": name, "id": "1"},))

    def succeeded(name):
        return (
            "celery.app.trace",
            "Task %(name)s[%(id)s] succeeded in %(runtime)ss: %(return_value)s",
            ({"name": name, "id": "1", "runtime": 0.01, "return_value": "None"},),
        )

    sent = (
        "celery.beat",
        "Scheduler: Sending due task %s (%s)",
        ("outbox-sweep", "controlplane.outbox_sweep"),
    )
    return sent, received, succeeded


@pytest.fixture
def captured():
    """Every record the configured loggers let through, as the console would see it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    yield stream
    root.removeHandler(handler)


def emit(logger_name, message, args):
    logging.getLogger(logger_name).info(message, *args)


def test_routine_tasks_are_the_beat_schedules():
    assert "controlplane.outbox_sweep" in routine_tasks() and "jobs.recovery_advance" in routine_tasks()
    assert "jobs.fault_handle" not in routine_tasks()  # a fault's handling is news, not routine


@override_settings(
    LOG_ROUTINE_TASKS=False
)  # the suite keeps them at INFO for the operations tests (conftest.py)
def test_beats_routine_tasks_log_at_debug_and_a_faults_handling_at_info(captured, caplog):
    sent, received, succeeded = celery_records()
    caplog.set_level(logging.INFO)
    for record in (
        sent,
        received("controlplane.outbox_sweep"),
        succeeded("jobs.recovery_advance"),
        succeeded("fleet.rollout_progress"),  # the step the rollout sweep queues every tick
        ("celery.worker.request", "Discarding revoked task: %s[%s]", ("jobs.slurm_sync", "1")),
        received("jobs.fault_handle"),
        succeeded("jobs.fault_handle"),
    ):
        emit(*record)
    lines = captured.getvalue().splitlines()
    assert lines == [
        "INFO celery.worker.strategy: Task jobs.fault_handle[1] received",
        "INFO celery.app.trace: Task jobs.fault_handle[1] succeeded in 0.01s: None",
    ], lines
    caplog.set_level(logging.DEBUG)
    emit(*sent)
    emit(*received("controlplane.outbox_sweep"))
    assert captured.getvalue().splitlines()[2:] == [
        "DEBUG celery.beat: Scheduler: Sending due task outbox-sweep (controlplane.outbox_sweep)",
        "DEBUG celery.worker.strategy: Task controlplane.outbox_sweep[1] received",
    ]


@override_settings(LOG_ROUTINE_TASKS=False)
def test_the_filter_sits_on_celerys_loggers_and_keeps_errors():
    for name in ("celery.beat", "celery.worker.strategy", "celery.worker.request", "celery.app.trace"):
        assert any(isinstance(f, RoutineTasksAtDebug) for f in logging.getLogger(name).filters), name
    failure = logging.LogRecord(
        "celery.app.trace",
        logging.ERROR,
        __file__,
        1,
        "Task %(name)s[%(id)s] raised",
        ({"name": "controlplane.outbox_sweep", "id": "1"},),
        None,
    )
    assert RoutineTasksAtDebug().filter(failure) and failure.levelno == logging.ERROR
    sent = logging.LogRecord(
        "celery.beat",
        logging.INFO,
        __file__,
        1,
        "Scheduler: Sending due task %s (%s)",
        ("outbox-sweep", "controlplane.outbox_sweep"),
        None,
    )
    with override_settings(LOG_ROUTINE_TASKS=True):
        assert RoutineTasksAtDebug().filter(sent) and sent.levelno == logging.INFO


@pytest.mark.django_db
def test_a_refused_request_logs_one_line_once(client):
    """Each StreamHandler a django.request record reaches writes into one buffer: a 403 from a page
    (PermissionDenied, which Django logs with its traceback) is one line, printed once, with DEBUG on too."""
    viewer = make_user(Role.TENANT_VIEWER, make_tenant())
    client.force_login(viewer)
    buffer = io.StringIO()
    swapped = []
    logger = logging.getLogger("django.request")
    while logger is not None:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler:  # the configured consoles, not pytest's capture
                swapped.append((handler, handler.setStream(buffer)))
        logger = logger.parent if logger.propagate else None
    assert swapped, "no console handler configured for django.request"
    try:
        with override_settings(DEBUG=True):
            assert client.get("/audit/").status_code == 403
            assert client.get("/api/v1/tenants/").status_code == 403
    finally:
        for handler, stream in swapped:
            handler.setStream(stream)
    lines = buffer.getvalue().splitlines()
    assert (
        len(lines) == 2
        and "Forbidden" in lines[0]
        and "/audit/" in lines[0]
        and "/api/v1/tenants/" in lines[1]
    ), lines
    assert "Traceback" not in buffer.getvalue()
    assert settings.LOGGING["loggers"]["django"]["handlers"] == []
