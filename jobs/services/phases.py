"""A job's phases (running, recovering, degraded) and its progress points, written by the jobs services."""

import functools
import operator

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from controlplane.prepared import cursor as prepared_cursor
from jobs.choices import JobPhaseKind
from jobs.models import Job, JobPhase, JobProgress


def phase_family(kind: str) -> list[str]:
    """The phases a new phase of this kind ends: a job has one open phase at a time (running or recovering),
    plus at most one open degraded phase."""
    return [kind] if kind == JobPhaseKind.DEGRADED else [JobPhaseKind.RUNNING, JobPhaseKind.RECOVERING]


def phase_start(job: Job, kind: str, reason: str = "", at=None) -> None:
    """End the open phase of this kind family and open a new one."""
    at = at or timezone.now()
    phases_switch(
        at=at,
        ended=[(job.pk, phase_family(kind))],
        started=[JobPhase(job=job, kind=kind, started_at=at, reason=reason[:200])],
        progress=[],
    )


def phase_end(job: Job, kinds=None, at=None) -> None:
    rows = JobPhase.objects.filter(job=job, ended_at__isnull=True)
    if kinds:
        rows = rows.filter(kind__in=kinds)
    rows.update(ended_at=at or timezone.now())


def phases_switch(
    *, at, ended: list[tuple[int, list[str]]], started: list[JobPhase], progress: list[JobProgress]
) -> None:
    """For a batch of jobs at once: end their open phases of the given kinds (``(job id, kinds)``), open the
    ``started`` phases and record ``progress``. A decision and a batch of completions do all three for every
    job they touch; on PostgreSQL it is one statement (two data-modifying CTEs and an INSERT)."""
    pairs = [(job_id, kind) for job_id, kinds in ended for kind in kinds]
    if connection.vendor != "postgresql":
        if pairs:
            JobPhase.objects.filter(
                functools.reduce(operator.or_, [Q(job_id=j, kind=k) for j, k in pairs]), ended_at__isnull=True
            ).update(ended_at=at)
        JobPhase.objects.bulk_create(started)
        JobProgress.objects.bulk_create(progress)
        return
    phase, points = JobPhase._meta.db_table, JobProgress._meta.db_table
    with prepared_cursor() as cursor:
        cursor.execute(
            f"WITH ended AS (UPDATE {phase} AS p SET ended_at = %s FROM unnest(%s::bigint[], %s::text[]) AS e(job_id, kind) "
            f"WHERE p.job_id = e.job_id AND p.kind = e.kind AND p.ended_at IS NULL), "
            f"opened AS (INSERT INTO {phase} (job_id, kind, started_at, ended_at, reason, node_id, nic_name) "
            f"SELECT * FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::timestamptz[], %s::text[], "
            f"%s::bigint[], %s::text[])) "
            f"INSERT INTO {points} (job_id, at, iteration, step_seconds, checkpoint) "
            f"SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::bigint[], %s::float8[], %s::bool[])",
            [
                at,
                [j for j, _ in pairs],
                [k for _, k in pairs],
                [p.job_id for p in started],
                [p.kind for p in started],
                [p.started_at for p in started],
                [p.ended_at for p in started],
                [p.reason for p in started],
                [p.node_id for p in started],
                [p.nic_name for p in started],
                [p.job_id for p in progress],
                [p.at for p in progress],
                [p.iteration for p in progress],
                [p.step_seconds for p in progress],
                [p.checkpoint for p in progress],
            ],
        )


def record_progress(
    job: Job, *, at=None, iteration: int | None = None, step_seconds=None, checkpoint=False
) -> None:
    JobProgress.objects.create(
        job=job,
        at=at or timezone.now(),
        iteration=job.iteration_now(at) if iteration is None else iteration,
        step_seconds=step_seconds,
        checkpoint=checkpoint,
    )
