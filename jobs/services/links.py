"""Failback: a job degraded by a link — failed over to another NIC, or left running on the degraded link because that
was cheaper — returns to full speed once the link is healthy again: up, with no new error for LINK_CLEAN_SECONDS
(the agent's counters, through ``jobs.hooks.links_clean``; where a node sends no telemetry, its NIC marked up
again, as a repair does). A failover fails back through the driver, and its ledger line books the degraded time
that was measured, not the expected one; the measured stretch also feeds the planner's estimates."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane import events
from controlplane.audit import audit_record
from fleet.choices import LinkState
from fleet.drivers import DriverError, driver_for
from fleet.models import NIC
from fleet.services import hardware
from jobs import hooks
from jobs.choices import ActionKind, ActionState, JobPhaseKind
from jobs.ledger import actual_gpu_hours
from jobs.models import Job, JobPhase, RecoveryAction
from jobs.services.estimates import DEGRADED_MEASURES, estimates_record
from jobs.services.phases import phase_end
from jobs.services.publishing import action_payload, job_topics

log = logging.getLogger(__name__)


def _clean(links: dict[tuple[int, str], object], now) -> set[tuple[int, str]]:
    """The links among ``links`` (→ since when they are known bad) that are healthy again."""
    window = timedelta(seconds=settings.LINK_CLEAN_SECONDS)
    evidence = hooks.links_clean(links, window=window, now=now)
    clean = {link for link, ok in evidence.items() if ok}
    silent = [link for link in links if link not in evidence and now - links[link] >= window]
    if silent:
        up = set(
            NIC.objects.filter(node_id__in={n for n, _ in silent}, link_state=LinkState.UP).values_list(
                "node_id", "name"
            )
        )
        clean |= {link for link in silent if link in up}
    return clean


def links_fail_back(*, now=None) -> int:
    """Fail back every job whose degrading link is healthy again; returns how many links were failed back."""
    now = now or timezone.now()
    phases = list(
        JobPhase.objects.filter(kind=JobPhaseKind.DEGRADED, ended_at__isnull=True, node__isnull=False)
        .exclude(nic_name="")
        .values_list("job_id", "node_id", "nic_name", "started_at")
    )
    failovers = list(
        RecoveryAction.objects.filter(
            kind=ActionKind.NIC_FAILOVER,
            state=ActionState.SUCCEEDED,
            dry_run=False,
            failed_back_at__isnull=True,
        ).values_list("job_id", "node_id", "nic_name", "ended_at")
    )
    links: dict[tuple[int, str], object] = {}
    for _, node_id, nic_name, since in phases + failovers:
        if node_id and nic_name and since:
            links[node_id, nic_name] = min(since, links.get((node_id, nic_name), since))
    clean = _clean(links, now)
    jobs = sorted(
        {job_id for job_id, node_id, nic_name, _ in phases + failovers if (node_id, nic_name) in clean}
    )
    done = 0
    for job_id in jobs:
        with transaction.atomic():
            done += _fail_back_job(job_id, clean, now)
    return done


def _fail_back_job(job_id: int, clean: set[tuple[int, str]], now) -> int:
    job = (
        Job.objects.select_for_update(of=("self",), no_key=True)
        .select_related("cluster")
        .filter(pk=job_id)
        .first()
    )
    if job is None:
        return 0
    mine = list(
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
        .select_related("node")
        .filter(
            job=job,
            kind=ActionKind.NIC_FAILOVER,
            state=ActionState.SUCCEEDED,
            dry_run=False,
            failed_back_at__isnull=True,
        )
    )
    phase = JobPhase.objects.filter(job=job, kind=JobPhaseKind.DEGRADED, ended_at__isnull=True).first()
    measured, back, done = [], set(), 0
    for action in mine:
        link = (action.node_id, action.nic_name)
        if link not in clean:
            continue
        if not _fail_back_action(job, action, now, measured):
            continue
        back.add(link)
        done += 1
    remaining = [a for a in mine if a.failed_back_at is None]
    phase_link = (phase.node_id, phase.nic_name) if phase is not None else None
    if phase is not None and not remaining and (phase_link in clean or phase_link in back):
        if phase_link not in back:
            # The job ran on the degraded link itself: it measured how long a grey link stays bad.
            measured.append(
                (job.cluster_id, DEGRADED_MEASURES["degraded"], (now - phase.started_at).total_seconds())
            )
            done += 1
        job.iteration, job.iteration_at = job.iteration_now(now), now
        job.slowdown, job.degraded_until = 0.0, now
        job.save(update_fields=["iteration", "iteration_at", "slowdown", "degraded_until"])
        phase_end(job, [JobPhaseKind.DEGRADED], at=now)
        back.add(phase_link)
        events.publish(
            job_topics(job),
            "job.failed_back",
            {
                "job": job.pk,
                "name": job.name,
                "state": job.state,
                "at": now.isoformat(),
                "summary": f"{phase.nic_name} healthy again: full speed",
            },
            url=f"/api/v1/jobs/{job.pk}/",
        )
    if back:
        hardware.nic_links_set(links=back, state=LinkState.UP)
    estimates_record(measured)
    return done


def _fail_back_action(job: Job, action: RecoveryAction, now, measured: list) -> bool:
    """Move one failover of ``job`` back to its healthy NIC through the driver and book its degraded stretch
    (its measure goes to ``measured``). Returns False, leaving it degraded, when the driver refuses."""
    try:
        driver_for(job.cluster).fail_over_nic(action.node, action.to_nic_name, action.nic_name)
    except DriverError as error:
        log.warning("failback of job %s to %s failed: %s; it stays degraded", job.pk, action.nic_name, error)
        return False
    seconds = max(0.0, (now - (action.ended_at or now)).total_seconds())
    action.failed_back_at, action.degraded_seconds = now, seconds
    action.gpu_hours_lost = actual_gpu_hours(
        gpus=action.gpus,
        pause_seconds=action.pause_seconds,
        work_lost_seconds=action.work_lost_seconds,
        degraded_seconds=seconds,
        slowdown=action.slowdown,
    )
    action.gpu_hours_saved = action.gpu_hours_baseline - action.gpu_hours_lost
    action.save(update_fields=["failed_back_at", "degraded_seconds", "gpu_hours_lost", "gpu_hours_saved"])
    measured.append(
        (job.cluster_id, DEGRADED_MEASURES["degraded" if action.impact == "degraded" else "nic"], seconds)
    )
    audit_record(
        actor=None,
        action="recovery.failback",
        target=action,
        tenant_id=job.tenant_id,
        changes={"nic": action.nic_name, "degraded_seconds": round(seconds, 1)},
    )
    events.publish(
        job_topics(job),
        "action.failed_back",
        {**action_payload(action), "summary": f"failed back to {action.nic_name} after {seconds:.0f} s"},
        url=f"/api/v1/actions/{action.pk}/",
    )
    return True
