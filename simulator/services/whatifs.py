"""Writes of the simulator app: what-if runs (started, advanced by a task, reported)."""

from dataclasses import asdict, fields

from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.access import principal, require
from controlplane.audit import audit_record
from controlplane.errors import ServiceError
from controlplane.queueing import queue
from simulator.models import WhatIfRun
from simulator.profiles import PROFILES
from simulator.replay_sensitivity import real_path_beside
from simulator.whatif import WhatIfConfig, whatif_run

LIMITS = {  # field: (low, high)
    "seed": (0, 2**31 - 1),
    "gpus": (8, 1_048_576),
    "days": (0.01, 366),
    "checkpoint_minutes": (1, 1440),
    "restart_overhead_minutes": (0, 240),
    "spare_fraction": (0, 0.5),
    "repair_hours": (0, 720),
    "nodes_per_leaf": (1, 1024),
    "migration_pause_seconds": (0, 3600),
    "migration_work_lost_minutes": (0, 1440),
    "checkpoint_write_seconds": (0, 3600),
    "software_crash_share": (0, 0.95),
    "failed_recovery_share": (0, 1),
    "rack_failure_share": (0, 1),
    "leaf_failure_share": (0, 1),
    "lemon_node_share": (0, 0.5),
    "lemon_fault_share": (0, 1),
    "lemon_retire_after": (1, 100),
}
INTEGER_FIELDS = ("seed", "gpus", "nodes_per_leaf", "lemon_retire_after")
# The share of a run's progress that is the formula replay's; the rest is waiting for the real path's scratch
# processes, which report no progress of their own.
FORMULA_SHARE = 0.9


def clean_config(data) -> WhatIfConfig:
    """A WhatIfConfig from user input, or ServiceError (400) naming the field."""
    if not isinstance(data, dict):
        raise ServiceError("must be an object", field="config")
    known = {f.name for f in fields(WhatIfConfig)}
    unknown = set(data) - known
    if unknown:
        raise ServiceError(f"unknown keys: {', '.join(sorted(map(str, unknown)))}", field="config")
    values = {}
    for name, (low, high) in LIMITS.items():
        if name not in data:
            continue
        value = data[name]
        if name == "software_crash_share" and value is None:
            continue  # as published (Table 5)
        integer = name in INTEGER_FIELDS
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (integer and not float(value).is_integer())
        ):
            raise ServiceError("must be a whole number" if integer else "must be a number", field=name)
        if not low <= value <= high:
            raise ServiceError(f"must be between {low} and {high}", field=name)
        values[name] = int(value) if integer else float(value)
    if "profile" in data:
        if data["profile"] not in PROFILES:
            raise ServiceError(f"one of {', '.join(sorted(PROFILES))}", field="profile")
        values["profile"] = data["profile"]
    config = WhatIfConfig(**values)
    if config.gpus % 8:
        raise ServiceError("a multiple of 8 (whole nodes)", field="gpus")
    return config


def _publish(run: WhatIfRun, kind: str) -> None:
    events.publish(
        [events.topic("fleet")],
        kind,
        {"run": run.pk, "state": run.state, "progress": round(run.progress, 3)},
        url=f"/api/v1/whatif/{run.pk}/",
    )


@transaction.atomic
def whatif_start(*, actor, config: dict) -> WhatIfRun:
    """Record a what-if run and queue it on commit (provider roles)."""
    require(principal(actor).is_provider, "what-if replays are for provider roles")
    cleaned = clean_config(config)
    _within_caps(actor)
    run = WhatIfRun.objects.create(created_by=actor, config=asdict(cleaned))
    audit_record(actor=actor, action="whatif.start", target=run, changes={"config": run.config})
    _publish(run, "whatif.queued")
    transaction.on_commit(lambda: _queue(run.pk))
    return run


def _within_caps(actor) -> None:
    """A replay occupies an analytics worker for minutes: at most WHATIF_MAX_PER_USER of one user's and
    WHATIF_MAX_RUNNING in all may be queued or running at once (429 above). Starts are serialized by a lock
    on PostgreSQL, so two requests cannot both take the last place."""
    from django.conf import settings
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('lockstep.whatif_start'))")
    live = WhatIfRun.objects.filter(state__in=[WhatIfRun.State.QUEUED, WhatIfRun.State.RUNNING])
    if live.filter(created_by=actor).count() >= settings.WHATIF_MAX_PER_USER:
        raise ServiceError(
            f"you have {settings.WHATIF_MAX_PER_USER} what-if replay(s) under way; wait for it to end",
            status=429,
        )
    if live.count() >= settings.WHATIF_MAX_RUNNING:
        raise ServiceError(
            f"{settings.WHATIF_MAX_RUNNING} what-if replays are under way; try again when one ends",
            status=429,
        )


def _queue(run_id: int) -> None:
    from simulator.tasks import whatif_task

    queue(whatif_task, run_id)


def whatif_execute(*, run_id: int) -> str:
    """Run a queued (or stalled) what-if to the end; safe to call twice: a finished run is left alone."""
    with transaction.atomic():
        run = WhatIfRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.state in (WhatIfRun.State.DONE, WhatIfRun.State.FAILED):
            return "nothing to do"
        run.state, run.started_at, run.progress = WhatIfRun.State.RUNNING, timezone.now(), 0.0
        run.save(update_fields=["state", "started_at", "progress"])
        _publish(run, "whatif.progress")
    last = [0.0]

    def progress(share: float) -> None:
        share *= FORMULA_SHARE
        if share - last[0] >= 0.1 * FORMULA_SHARE or share >= FORMULA_SHARE:
            last[0] = share
            with transaction.atomic():
                WhatIfRun.objects.filter(pk=run_id).update(progress=share)
                run.progress = share
                _publish(run, "whatif.progress")

    try:
        config = WhatIfConfig(**run.config)
        # the replay through Lockstep's own services runs in scratch processes beside the formula replay
        real_path = real_path_beside(config)
        report = whatif_run(config, progress=progress)
        report["real_path"] = real_path.result()
    except Exception as error:  # the run is recorded as failed with the reason; nothing else depends on it
        with transaction.atomic():
            WhatIfRun.objects.filter(pk=run_id).update(
                state=WhatIfRun.State.FAILED, error=str(error)[:300], finished_at=timezone.now()
            )
            run.state = WhatIfRun.State.FAILED
            _publish(run, "whatif.failed")
        return "failed"
    with transaction.atomic():
        WhatIfRun.objects.filter(pk=run_id).update(
            state=WhatIfRun.State.DONE, progress=1.0, report=report, finished_at=timezone.now()
        )
        run.state, run.progress = WhatIfRun.State.DONE, 1.0
        _publish(run, "whatif.done")
    return "done"


def whatif_sweep(*, stale_seconds: float = 300.0) -> int:
    """Re-queue runs whose message was lost (queued for a while, or running with no progress for long)."""
    from datetime import timedelta

    now = timezone.now()
    lost = list(
        WhatIfRun.objects.filter(
            state=WhatIfRun.State.QUEUED, created_at__lt=now - timedelta(seconds=30)
        ).values_list("pk", flat=True)
    )
    lost += list(
        WhatIfRun.objects.filter(
            state=WhatIfRun.State.RUNNING, started_at__lt=now - timedelta(seconds=stale_seconds)
        ).values_list("pk", flat=True)
    )
    for run_id in lost:
        if WhatIfRun.objects.filter(pk=run_id, state=WhatIfRun.State.RUNNING).update(
            state=WhatIfRun.State.QUEUED
        ):
            pass
        _queue(run_id)
    return len(lost)
