"""Rank replacement (issue 49): a protected job keeps running through a node loss. Lockstep took the lost node out of
the scheduler (``RecoveryAction`` of kind rank_replacement, through the driver's ``replace_rank``); the job's
runtime put a standby in the lost rank's place and reports it (``rank_replaced``), which books the recovery with
what was measured (docs/gpu-hours.md):

- pause = from the earliest report of the incident (or the runtime's own noticing, whichever came first) to the
  runtime's first completed step with the standby in place (the report's ``at``);
- work lost = the steps the job redid (``lost_iterations``) × its measured step time;
- snapshot overhead as for a restore (what its snapshots cost since its previous recovery).

The lost rank's allocation moves to the standby's node, and beat asks the driver for a new standby so that the
job is protected again. Without a report by RANK_REPLACEMENT_DEADLINE_SECONDS, the action fails and the
recovery falls back (jobs.services.fallback: the next cheapest, restore_from_snapshot or a restart)."""

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.audit import audit_record
from fleet.drivers import DriverError, driver_for
from fleet.models import Node
from jobs import placement
from jobs.choices import ACTIVE_ACTION_STATES, ActionKind, ActionState, FaultKind, IncidentState
from jobs.ledger import actual_gpu_hours, baseline_gpu_hours
from jobs.models import FaultEvent, Incident, Job, JobAllocation, JobSnapshot, RecoveryAction
from jobs.services.estimates import RANK_REPLACEMENT_MEASURE, estimates_record, restart_baseline_of
from jobs.services.in_job import epoch
from jobs.services.publishing import publish_action

log = logging.getLogger(__name__)


def rank_replaced(*, job: Job, report: JobSnapshot) -> RecoveryAction | None:
    """The runtime reports a standby in the lost rank's place (inside ``snapshot_report``'s transaction): measure
    the replacement, move the lost rank's allocation to the standby's node, and book and complete Lockstep's
    rank_replacement of the job, if one is under way; when the runtime was quicker than Lockstep's decision, the
    replacement is recorded in the lost node's open incident instead. Either way beat then asks for a new standby
    (``standbys_replenish``). Returns the action (None when there is none to book: the report is kept, its measurement counts)."""
    details = report.details
    at, fault_at = epoch(details["at"]), epoch(details.get("fault_at"))
    if fault_at is not None and at >= fault_at:
        estimates_record([(job.cluster_id, RANK_REPLACEMENT_MEASURE, (at - fault_at).total_seconds())])
    placement.lock_cluster(job.cluster_id)
    action = (
        RecoveryAction.objects.select_for_update(of=("self",), no_key=True)
        .select_related("job", "incident")
        .filter(job=job, kind=ActionKind.RANK_REPLACEMENT, dry_run=False, state__in=ACTIVE_ACTION_STATES)
        .order_by("-planned_at")
        .first()
    )
    if action is None:
        # Before Lockstep decided (its decision then finds the job off the lost node): recorded from the report.
        action = _replaced_before_decided(job, details)
        _move_ranks(job, details)
        if action is not None:
            _book(action, job, report, at, fault_at)
        return action
    _move_ranks(job, details)
    from jobs.services.advance import _complete_many

    _complete_many([action])  # Succeeded, the job Running again, its phases; the ledger is rebooked below
    _book(action, job, report, at, fault_at)
    return action


def _book(action: RecoveryAction, job: Job, report: JobSnapshot, at, fault_at) -> None:
    """Book a replacement from the runtime's report (the module docstring), write and audit it."""
    from jobs.services.snapshots import _overhead_since_previous_recovery

    details = report.details
    earliest = min(t for t in (action.detected_at, _opened(action.incident_id), fault_at) if t is not None)
    action.snapshot, action.restore_iteration, action.resumed_at = report, report.iteration, at
    action.pause_seconds = max(0.0, (at - earliest).total_seconds())
    lost_iterations = int(details.get("lost_iterations") or 0)
    action.work_lost_seconds = lost_iterations * job.seconds_per_iteration
    action.snapshot_overhead_seconds = _overhead_since_previous_recovery(job, action)
    action.gpu_hours_lost = actual_gpu_hours(
        gpus=action.gpus,
        pause_seconds=action.pause_seconds,
        work_lost_seconds=action.work_lost_seconds,
        overhead_seconds=action.snapshot_overhead_seconds,
    )
    action.gpu_hours_saved = action.gpu_hours_baseline - action.gpu_hours_lost
    action.reason = (
        f"{action.reason} Measured: rank(s) {', '.join(map(str, details.get('lost_ranks') or []))} taken by "
        f"{', '.join(details.get('to_nodes') or [])}; training again {action.pause_seconds:.1f} s after the "
        f"first report of the fault, from iteration {report.iteration} ({lost_iterations} step(s) redone); "
        f"the survivors kept running (generation {details.get('generation', '?')})."
    )[:4000]
    action.save(
        update_fields=[
            "snapshot",
            "restore_iteration",
            "resumed_at",
            "pause_seconds",
            "work_lost_seconds",
            "snapshot_overhead_seconds",
            "gpu_hours_lost",
            "gpu_hours_saved",
            "reason",
        ]
    )
    audit_record(
        actor=None,
        action="recovery.measured",
        target=action,
        tenant_id=job.tenant_id,
        changes={
            "pause_seconds": round(action.pause_seconds, 3),
            "lost_iterations": lost_iterations,
            "to_nodes": details.get("to_nodes") or [],
            "gpu_hours_saved": round(action.gpu_hours_saved, 4),
        },
    )
    publish_action(action, "action.measured")


def _replaced_before_decided(job: Job, details: dict) -> RecoveryAction | None:
    """The runtime replaced a rank on a node whose incident is open, before Lockstep decided anything for the job
    in it: a rank_replacement recorded (not carried out by Lockstep) in that incident, with the restart baseline it
    spared the job. None when no open incident names the node, or the job already has a recovery in it."""
    fault = (
        FaultEvent.objects.filter(
            cluster_id=job.cluster_id,
            node__hostname__in=list(details.get("from_nodes") or []),
            kind=FaultKind.NODE_UNREACHABLE,
            incident__state=IncidentState.OPEN,
        )
        .select_related("node")
        .order_by("detected_at")
        .first()
    )
    if fault is None or RecoveryAction.objects.filter(job=job, incident_id=fault.incident_id).exists():
        return None
    baseline = restart_baseline_of(job)
    reached = int(details.get("reached") or job.iteration)
    since_checkpoint = max(0, reached - job.last_checkpoint_iteration) * job.seconds_per_iteration
    now = timezone.now()
    return RecoveryAction.objects.create(
        incident_id=fault.incident_id,
        job=job,
        cluster_id=job.cluster_id,
        kind=ActionKind.RANK_REPLACEMENT,
        impact="node",
        state=ActionState.SUCCEEDED,
        node=fault.node,
        detected_at=fault.detected_at,
        planned_at=now,
        ended_at=now,
        gpus=job.gpus,
        gpu_hours_baseline=baseline_gpu_hours(
            gpus=job.gpus,
            seconds_since_checkpoint=since_checkpoint,
            restart_overhead_seconds=baseline.seconds,
        ),
        reason="The job's runtime replaced the lost rank with a standby before Lockstep decided; recorded from "
        "its report.",
        estimate={"restart_overhead": baseline.as_dict()},
    )


def _opened(incident_id: int | None):
    if incident_id is None:
        return None
    return Incident.objects.filter(pk=incident_id).values_list("opened_at", flat=True).first()


def _move_ranks(job: Job, details: dict) -> None:
    """Each lost rank's allocation moves from the node it was lost on to the standby's node that took it."""
    pairs = list(zip(details.get("from_nodes") or [], details.get("to_nodes") or [], strict=False))
    if not pairs:
        return
    nodes = {
        node.hostname: node
        for node in Node.objects.filter(
            cluster_id=job.cluster_id, hostname__in={h for pair in pairs for h in pair}
        )
    }
    held = {
        allocation.node.hostname: allocation
        for allocation in JobAllocation.objects.filter(job=job, released_at__isnull=True).select_related(
            "node"
        )
    }
    moves = [
        (held[lost], nodes[standby])
        for lost, standby in pairs
        if lost in held and standby in nodes and standby not in held
    ]
    placement.allocations_move(moves)


# How long after a replacement beat still asks for its new standby (a driver that kept failing gives up then).
REPLENISH_WITHIN = timedelta(hours=1)


def standbys_replenish() -> int:
    """Beat's step: each rank replacement that has not asked for its new standby yet asks the cluster's driver for
    one on the spare partition, so that the job is protected again (its runtime's next report books it). Once per
    replacement, whatever the answer (``estimate["standby"]`` records it); a driver that cannot start one leaves
    the job protected with the standbys it has left, and the action says so. Returns how many asked."""
    due = list(
        RecoveryAction.objects.filter(
            kind=ActionKind.RANK_REPLACEMENT,
            state=ActionState.SUCCEEDED,
            dry_run=False,
            ended_at__gte=timezone.now() - REPLENISH_WITHIN,
        )
        .exclude(estimate__has_key="standby")
        .values_list("pk", flat=True)[:50]
    )
    for action_id in due:
        standby_replenish(action_id=action_id)
    return len(due)


def standby_replenish(*, action_id: int) -> str:
    """Ask the driver for the new standby of one rank replacement (``standbys_replenish``), once. Returns what was
    done, in words."""
    with transaction.atomic():
        action = (
            RecoveryAction.objects.select_for_update(of=("self",), no_key=True, skip_locked=True)
            .select_related("job", "cluster")
            .filter(pk=action_id)
            .exclude(estimate__has_key="standby")
            .first()
        )
        if action is None or action.job is None:
            return "done already"
        replenish, started = getattr(driver_for(action.cluster), "replenish_standby", None), ""
        if not callable(replenish):
            outcome = "no new standby: the cluster's driver cannot start one"
        else:
            try:
                result = replenish(action.job.ref)
                outcome = f"new standby asked for: {result.detail}"
                started = _standby_job_id(result.handle)
            except (DriverError, NotImplementedError) as error:
                log.warning("standby for %s not started: %s", action.job.ref, error)
                outcome = f"no new standby: {error}"
        standby = {"at": timezone.now().isoformat(), "outcome": outcome}
        if started:  # the standby job Lockstep started: the sync leaves it out of adoption and notes its node
            standby["slurm_job_id"] = started
        action.estimate = {**action.estimate, "standby": standby}
        action.reason = f"{action.reason} Standbys: {outcome}."[:4000]
        action.save(update_fields=["estimate", "reason"])
        audit_record(
            actor=None,
            action="job.standby_replenish",
            target=action.job,
            tenant_id=action.job.tenant_id,
            changes={"action": action_id, "outcome": outcome[:300]},
        )
    return outcome


def _standby_job_id(handle: str) -> str:
    """The scheduler's id of the standby job a driver started (``standby:<its id>:<the job's id>``; "" if the
    handle names none)."""
    kind, _, rest = (handle or "").partition(":")
    return rest.split(":", 1)[0] if kind == "standby" else ""
