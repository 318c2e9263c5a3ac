"""The node-death scenario on a real Slurm, with and without Lockstep (tests/slurm and bench/slurm_recovery.py).

The training job (agent/lockstep_agent/examples/train_slurm.py) runs on two nodes; once it has checkpointed and
trained past its checkpoint, node ``n2`` dies: its slurmd, its step daemon and its rank are killed at once.

- ``with_lockstep``: beat's work is done here in a loop (the Slurm sync, fault handling, recovery advance; each
  what a beat task calls) until the job trains again on the spare, and the phases are timed from what was
  recorded: the fault's detection, the action's start and end, the job's first step after the restart.
- ``without_lockstep``: nothing but Slurm: the job is watched until Slurm requeues it and it trains again, or it
  is lost (ended, not requeued) — by the partition's policy and ``SlurmdTimeout``.

With the protection runtime (``SlurmCluster(holders=True)``, a cluster whose policy turns the runtime on):
``with_lockstep(..., snapshot_every=N)`` runs the same node death under a protected job (restored from memory);
``predicted_move`` flags n2 as about to fail and follows the job's write-through and move off it before n2 dies;
``ab_run`` runs a protected and an unprotected job side by side and kills a node under each.

The training job and the node's death are the local Slurm's (``jobs.local_slurm.training``, which the Slurm demo
runs too). The apps' models and services are imported inside the functions, so importing this module needs no
Django set-up.
"""

import functools
import json
import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

from jobs.local_slurm.training import kill_n2, ranks, submit_in_job_training, submit_training
from tests.support.slack import SLACK


def first_step_at(folder: Path, restart: int) -> float | None:
    path = folder / "ckpt" / "ranks" / str(restart) / "first_step.json"
    try:
        return json.loads(path.read_text())["at"]
    except (OSError, ValueError, KeyError):
        return None


def newest_checkpoint(folder: Path) -> int:
    """The step of the newest checkpoint the training job wrote under ``folder`` (0: none yet)."""
    steps = [int(path.stem.split("-")[1]) for path in (folder / "ckpt").glob("ckpt-*.pt")]
    return max(steps, default=0)


def _checkpoint_being_written(folder: Path) -> bool:
    """Rank 0 writes a checkpoint to ``ckpt-N.tmp`` and renames it: stopped in between, it would add one on
    resuming."""
    return any((folder / "ckpt").glob("ckpt-*.tmp"))


def squeue_job(slurm, slurm_id: str) -> dict | None:
    jobs = json.loads(
        slurm.run("squeue", "--json", "--all", "--jobs", slurm_id, check=False).stdout or "{}"
    ).get("jobs")
    return jobs[0] if jobs else None


def _until(predicate, timeout: float, what: str, step=None, interval: float = 0.25):
    deadline = time.monotonic() + timeout * SLACK
    while time.monotonic() < deadline:
        if step is not None:
            step()
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what} ({timeout * SLACK:.0f} s)")


def beat_once(cluster) -> None:
    """Beat's work for one cluster, done in the caller's loop: the Slurm sync, the faults it stored (and any other
    new one) handled, recovery advanced — each what the beat task calls."""
    from jobs.models import FaultEvent
    from jobs.services.advance import recovery_advance
    from jobs.services.faults import fault_handle
    from jobs.services.slurm_jobs import slurm_sync

    result = slurm_sync(cluster=cluster)
    for fault_id in result.get("faults", []):
        fault_handle(fault_id=fault_id)
    for fault_id in FaultEvent.objects.filter(cluster=cluster, state="new").values_list("pk", flat=True):
        fault_handle(fault_id=fault_id)
    recovery_advance(cluster_ids=[cluster.pk])


def _epoch(moment: datetime) -> float:
    return moment.astimezone(UTC).timestamp()


def with_lockstep(
    slurm,
    cluster,
    folder: Path,
    *,
    launcher_token: str,
    url: str,
    checkpoint_every: int = 20,
    timeout: float = 150,
    snapshot_every: int = 0,
    kill_after: int | None = None,
) -> dict:
    """Run the scenario under Lockstep; returns what happened and when (epoch seconds and durations).

    With ``snapshot_every`` the job runs protected (the cluster's policy must turn the runtime on): the node is
    killed once Lockstep counts the job protected, and the run ends when the runtime has restored it and it trains
    again (``restore_from_snapshot``); without, when it trains again after its restart from checkpoint.
    ``kill_after``: iterations past the second checkpoint at which the node dies (default half an interval)."""
    from jobs.choices import ActionKind, SnapshotKind
    from jobs.models import FaultEvent, Job, JobProgress, JobSnapshot, RecoveryAction, SlurmJob
    from jobs.protection import job_protection

    kind = ActionKind.RESTORE_FROM_SNAPSHOT if snapshot_every else ActionKind.RESTART_FROM_CHECKPOINT
    kill_after = checkpoint_every // 2 if kill_after is None else kill_after
    slurm_id = submit_training(
        slurm,
        folder,
        checkpoint_every=checkpoint_every,
        env={"LOCKSTEP_URL": url, "LOCKSTEP_LAUNCHER_TOKEN": launcher_token},
        snapshot_every=snapshot_every,
    )

    beat = functools.partial(beat_once, cluster)

    def trained_past_checkpoint():
        job = Job.objects.filter(slurm__cluster=cluster, slurm__slurm_job_id=slurm_id).first()
        return (
            job
            if job
            and job.last_checkpoint_iteration >= 2 * checkpoint_every
            and job.iteration >= job.last_checkpoint_iteration + kill_after
            # The reports lag the training by up to a report interval: if the next checkpoint is on disk already,
            # the node would die just past it and the restart would lose nothing. Wait for the next interval.
            and not (folder / "ckpt" / f"ckpt-{job.last_checkpoint_iteration + checkpoint_every}.pt").exists()
            and (not snapshot_every or job_protection(job).protected)
            else None
        )

    job = _until(trained_past_checkpoint, 120, "the job to train past its second checkpoint", step=beat)
    iteration_at_fault, checkpoint_at_fault = job.iteration, job.last_checkpoint_iteration
    killed_at, before = kill_n2(slurm, folder)

    def restarted():
        action = (
            RecoveryAction.objects.filter(job=job, kind=kind, state="succeeded").order_by("-ended_at").first()
        )
        if action is None or first_step_at(folder, 1) is None:
            return None
        if (
            snapshot_every
            and not JobSnapshot.objects.filter(
                job=job,
                kind__in=(SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK),
                started_at__gte=action.started_at,
            ).exists()
        ):
            return None  # the runtime has not said yet where it restored to
        action.refresh_from_db()
        progress = (
            JobProgress.objects.filter(
                job=job, at__gt=action.ended_at, iteration__gt=action.restore_iteration
            )
            .order_by("at")
            .first()
        )
        return (action, progress) if progress else None

    action, progress = _until(restarted, timeout, "the job to train again after the restart", step=beat)
    job.refresh_from_db()
    # What the job had reached when it died: its last report before the restart was started.
    iteration_at_fault = max(
        JobProgress.objects.filter(job=job, at__lt=action.started_at).values_list("iteration", flat=True)
    )
    fault = FaultEvent.objects.filter(node__hostname="n2", cluster=cluster).order_by("detected_at").first()
    resumed = json.loads((folder / "ckpt" / "ranks" / "1" / "resumed.json").read_text())
    link = SlurmJob.objects.get(job=job)
    requeued = squeue_job(slurm, slurm_id) or {}
    detected = _epoch(fault.received_at)
    started, ended = _epoch(action.started_at), _epoch(action.ended_at)
    trained = first_step_at(folder, 1)
    return {
        "slurm_job_id": slurm_id,
        "job": job,
        "action": action,
        "fault": fault,
        "link": link,
        "before": before,
        "after": ranks(folder, 1),
        "slurm_job": requeued,
        "killed_at": killed_at,
        "iteration_at_fault": iteration_at_fault,
        "checkpoint_at_fault": action.restore_iteration,
        "checkpoint_seen_before_kill": checkpoint_at_fault,
        "first_progress": progress,
        "resumed": resumed,  # what the job itself says it resumed from (memory or disk) and at which step
        "restore": JobSnapshot.objects.filter(
            job=job, kind__in=(SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK)
        )
        .order_by("-ended_at")
        .first(),
        "seconds": {
            "detect": detected - killed_at,  # Slurm's ping fails; the sync stores the fault
            "decide": started - detected,  # Lockstep decides and starts the requeue
            "slurm_requeue": ended - started,  # drain, requeue without n2, Slurm runs it on the spare
            "job_restart": trained - ended,  # the job's own restart: Python, torch, gloo, checkpoint
            "total": trained - killed_at,
        },
    }


def booked_work_bounds(job, action) -> tuple[float, float]:
    """The least and the most work lost (seconds) the ledger can have booked for ``action`` from the job's own
    reports: the iterations since its restore point as of any report in effect while the action ran, at a step
    time within those the job reported (the job's estimate is a moving average of them, from its initial one).
    A bound from the run itself, however slow the machine made the steps."""
    from jobs.models import Job, JobProgress

    reports = list(JobProgress.objects.filter(job=job, at__lte=action.ended_at).order_by("at", "pk"))
    before = [report for report in reports if report.at < action.started_at]
    during = [report for report in reports if report.at >= action.started_at]
    candidates = [*before[-1:], *during] + ([max(before, key=lambda r: r.iteration)] if before else [])
    iterations = [max(0, report.iteration - action.restore_iteration) for report in candidates]
    steps = [report.step_seconds for report in reports if report.step_seconds]
    steps.append(Job._meta.get_field("seconds_per_iteration").default)
    return min(iterations) * min(steps), max(iterations) * max(steps)


def without_lockstep(slurm, folder: Path, *, checkpoint_every: int = 20, timeout: float = 240) -> dict:
    """The same failure with Slurm alone: when did Slurm notice, was the job requeued, when did it train again."""
    slurm_id = submit_training(slurm, folder, checkpoint_every=checkpoint_every)
    _until(
        lambda: (folder / "ckpt" / f"ckpt-{2 * checkpoint_every}.pt").exists() and first_step_at(folder, 0),
        120,
        "the job to checkpoint twice",
    )
    time.sleep(0.5)
    killed_at, before = kill_n2(slurm, folder)
    seen: dict = {}

    def fate():
        node = next(n for n in json.loads(slurm.run("sinfo", "--json").stdout)["nodes"] if n["name"] == "n2")
        if node["state"] == "down" and "down" not in seen:
            seen["down"] = time.time()
        job = squeue_job(slurm, slurm_id) or {}
        if int(job.get("restart_cnt") or 0) >= 1 and "requeued" not in seen:
            seen["requeued"] = time.time()
        if job.get("job_state") in ("FAILED", "CANCELLED", "COMPLETED", "NODE_FAIL", "TIMEOUT") and not int(
            job.get("restart_cnt") or 0
        ):
            seen["lost"] = time.time()
            return True
        trained = first_step_at(folder, 1)
        if trained:
            seen["trained"] = trained
            return True
        return False

    _until(fate, timeout, "Slurm to requeue or lose the job")
    return {
        "slurm_job_id": slurm_id,
        "killed_at": killed_at,
        "seconds": {key: value - killed_at for key, value in seen.items()},
        "lost": "lost" in seen,
        "slurm_job": squeue_job(slurm, slurm_id) or {},
    }


def predicted_move(
    slurm,
    cluster,
    folder: Path,
    *,
    launcher_token: str,
    url: str,
    checkpoint_every: int = 40,
    snapshot_every: int = 5,
    timeout: float = 150,
) -> dict:
    """A predicted failure under a protected job on a real Slurm: the predictor flags n2, Lockstep asks the job to
    write through, moves it off n2 (a requeue without it, onto the spare) before n2 fails, and the runtime restores
    the written-through step from memory; then n2 really dies. Returns what happened and when."""
    from fleet.models import Node
    from jobs.choices import ActionKind, FaultKind, FaultSource, SnapshotKind
    from jobs.models import FaultEvent, Job, JobProgress, JobSnapshot, RecoveryAction
    from jobs.protection import job_protection
    from jobs.services.advance import recovery_advance
    from jobs.services.faults import fault_handle, fault_ingest

    slurm_id = submit_training(
        slurm,
        folder,
        checkpoint_every=checkpoint_every,
        env={"LOCKSTEP_URL": url, "LOCKSTEP_LAUNCHER_TOKEN": launcher_token},
        snapshot_every=snapshot_every,
    )

    beat = functools.partial(beat_once, cluster)

    def protected_and_training():
        job = Job.objects.filter(slurm__cluster=cluster, slurm__slurm_job_id=slurm_id).first()
        return (
            job
            if job
            and job.last_checkpoint_iteration >= checkpoint_every
            and job.iteration >= job.last_checkpoint_iteration + snapshot_every + 2
            and job_protection(job).protected
            else None
        )

    job = _until(protected_and_training, 120, "the protected job to train past its checkpoint", step=beat)
    before = ranks(folder, 0)
    n2 = Node.objects.get(cluster=cluster, hostname="n2")
    Node.objects.filter(pk=n2.pk).update(risk_score=0.95)  # what the predictor writes on the node
    predicted_at = time.time()
    prediction, _ = fault_ingest(
        source=FaultSource.PREDICTOR,
        kind=FaultKind.PREDICTED_FAILURE,
        node=n2,
        details={"score": 0.95, "horizon_hours": 1.0, "cause": "test: ECC errors rising"},
    )
    fault_handle(fault_id=prediction.pk)

    def moved():
        action = RecoveryAction.objects.filter(
            job=job, kind=ActionKind.PROACTIVE_MIGRATION, state="succeeded"
        ).first()
        if action is None or first_step_at(folder, 1) is None:
            return None
        restore = (
            JobSnapshot.objects.filter(
                job=job,
                kind__in=(SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK),
                started_at__gte=action.started_at,
            )
            .order_by("ended_at")
            .first()
        )
        if restore is None:
            return None
        progress = JobProgress.objects.filter(
            job=job, at__gt=restore.ended_at, iteration__gt=restore.iteration
        ).first()
        return (action, restore, progress) if progress else None

    action, restore, progress = _until(
        moved, timeout, "the job to be moved off n2 and train again", step=beat
    )
    write_through = (
        JobSnapshot.objects.filter(job=job, kind=SnapshotKind.WRITE_THROUGH).order_by("ended_at").first()
    )
    reached = max(
        JobProgress.objects.filter(job=job, at__lt=restore.started_at).values_list("iteration", flat=True)
    )
    # The node the prediction was about now really fails, with no job left on it.
    after = ranks(folder, 1)
    killed_at = slurm.kill_node("n2")
    _until(
        lambda: FaultEvent.objects.filter(node=n2, kind=FaultKind.NODE_UNREACHABLE).exists(),
        60,
        "Slurm to report n2 down",
        step=beat,
    )
    recovery_advance(cluster_ids=[cluster.pk])
    action.refresh_from_db()
    resumed = json.loads((folder / "ckpt" / "ranks" / "1" / "resumed.json").read_text())
    return {
        "slurm_job_id": slurm_id,
        "job": job,
        "action": action,
        "prediction": prediction,
        "write_through": write_through,
        "restore": restore,
        "reached": reached,
        "before": before,
        "after": after,
        "resumed": resumed,
        "first_progress": progress,
        "seconds": {
            "write_through": _epoch(write_through.ended_at) - predicted_at if write_through else None,
            "moved": _epoch(restore.ended_at) - predicted_at,  # predicted → restored on the spare
            "resume": (first_step_at(folder, 1) or 0) - predicted_at,
        },
        "killed_at": killed_at,
    }


def ab_run(
    slurm,
    cluster,
    folder: Path,
    *,
    launcher_token: str,
    url: str,
    checkpoint_every: int = 40,
    snapshot_every: int = 5,
    kill_after: int | None = None,
    timeout: float = 180,
    standbys: int = 0,
) -> dict:
    """``manage.py simulate ab-nic``'s story on a real Slurm: two training jobs on one cluster whose policy turns
    the protection runtime on, one running it (protected) and one not (unprotected: its runtime never reports).
    Once the unprotected one is ``kill_after`` steps past a checkpoint (default half an interval), the node of
    each job's rank 1 dies at once (slurmd, rank, snapshot holder). Lockstep restores the protected job from
    memory and restarts the other from its checkpoint; each arm's loss and time to resume come from its own
    progress reports. The Slurm needs two spare nodes (``SlurmCluster(nodes=6, spare_nodes=2, holders=True)``).

    With ``standbys`` (issue 49) the protected job runs with that many standbys in its own allocation and a
    snapshot every step: its lost rank is replaced in place (rank_replacement, the survivor keeping its process)
    instead of a requeue; the Slurm needs ``standbys`` more nodes (``nodes=7`` for one). Its arm then also says
    whether the survivor kept its process (``survivor_pids``: before, after)."""
    from jobs.choices import ActionKind, SnapshotKind
    from jobs.models import Job, JobProgress, JobSnapshot, JobStandby, RecoveryAction
    from jobs.protection import job_protection

    kill_after = checkpoint_every // 2 if kill_after is None else kill_after
    arms = {"protected": snapshot_every, "unprotected": 0}
    env = {"LOCKSTEP_URL": url, "LOCKSTEP_LAUNCHER_TOKEN": launcher_token}
    ids = {}
    for name, every in arms.items():
        if name == "protected" and standbys:
            ids[name] = submit_in_job_training(
                slurm, folder / name, standbys=standbys, checkpoint_every=checkpoint_every, env=env
            )
            continue
        ids[name] = submit_training(
            slurm, folder / name, checkpoint_every=checkpoint_every, env=env, snapshot_every=every
        )

    beat = functools.partial(beat_once, cluster)

    def jobs_of():
        found = {
            name: Job.objects.filter(slurm__cluster=cluster, slurm__slurm_job_id=i).first()
            for name, i in ids.items()
        }
        return found if all(found.values()) else None

    def reported_ready():
        found = jobs_of()
        if not found:
            return None
        protected, unprotected = found["protected"], found["unprotected"]
        since = unprotected.iteration - unprotected.last_checkpoint_iteration
        return (
            found
            if protected.last_checkpoint_iteration >= checkpoint_every
            and job_protection(protected).protected
            and JobStandby.objects.filter(job=protected, released_at__isnull=True).count() >= standbys
            and unprotected.last_checkpoint_iteration >= checkpoint_every
            and kill_after <= since < checkpoint_every
            else None
        )

    def ready():
        """Both jobs where the story needs them, checked against the unprotected job's disk with its rank 0 (the
        only one that writes checkpoints) stopped: its reports lag its training (by seconds on a loaded machine),
        and a checkpoint written between the reports and the kill would leave it nothing to lose. Returns with
        that rank still stopped, or resumes it and answers None."""
        found = reported_ready()
        if not found:
            return None
        writer = next(r["pid"] for r in ranks(folder / "unprotected", 0) if r["rank"] == 0)
        os.kill(writer, signal.SIGSTOP)
        on_disk = newest_checkpoint(folder / "unprotected")
        if on_disk == found["unprotected"].last_checkpoint_iteration and not _checkpoint_being_written(
            folder / "unprotected"
        ):
            return found, on_disk
        os.kill(writer, signal.SIGCONT)
        return None

    jobs, checkpoint_at_kill = _until(
        ready, 150, "both jobs to train past a checkpoint, one of them protected", step=beat, interval=0.05
    )
    victims = {}
    for name in arms:
        before = ranks(folder / name, 0)
        victims[name] = (
            next(r["node"] for r in before if r["rank"] == 1),
            [r["pid"] for r in before if r["rank"] == 1],
        )
    killed_at = time.time()
    for node, pids in victims.values():
        slurm.kill_node(node, pids)
    # The unprotected job's rank 0 stays stopped: resumed, it could still finish the step it was in and write
    # the checkpoint that step ends at. Its peer is gone, so it would train no further anyway; Slurm's requeue
    # ends it (SIGCONT, then SIGTERM).
    kinds = {"protected": ActionKind.RESTORE_FROM_SNAPSHOT, "unprotected": ActionKind.RESTART_FROM_CHECKPOINT}
    if standbys:
        kinds["protected"] = ActionKind.RANK_REPLACEMENT

    def recovered(name):
        job = jobs[name]
        if name == "protected" and standbys:
            action = RecoveryAction.objects.filter(
                job=job, kind=kinds[name], state="succeeded", resumed_at__isnull=False
            ).first()
            after = action and JobProgress.objects.filter(job=job, at__gt=action.resumed_at).exists()
            return (action, None) if after else None
        action = RecoveryAction.objects.filter(job=job, kind=kinds[name], state="succeeded").first()
        if action is None or first_step_at(folder / name, 1) is None:
            return None
        restore = None
        if name == "protected":
            restore = JobSnapshot.objects.filter(
                job=job,
                kind__in=(SnapshotKind.RESTORE, SnapshotKind.DISK_FALLBACK),
                started_at__gte=action.started_at,
            ).first()
            if restore is None:
                return None
            action.refresh_from_db()
        progress = JobProgress.objects.filter(
            job=job, at__gt=action.ended_at, iteration__gt=action.restore_iteration
        ).first()
        return (action, restore) if progress else None

    try:
        done = _until(
            lambda: (lambda a, b: (a, b) if a and b else None)(
                recovered("protected"), recovered("unprotected")
            ),
            timeout,
            "both jobs to train again",
            step=beat,
        )
    except TimeoutError as error:
        actions = RecoveryAction.objects.filter(job__in=list(jobs.values())).order_by("pk")
        seen = "; ".join(f"job {a.job_id} {a.kind} {a.state} {a.error or a.reason[:160]}" for a in actions)
        raise TimeoutError(f"{error}: {seen or 'no action'}") from error
    out = {
        "killed_at": killed_at,
        "kill_after": kill_after,
        "victims": {n: v[0] for n, v in victims.items()},
        "checkpoint_at_kill": checkpoint_at_kill,  # the unprotected job's newest checkpoint when its node died
    }
    for name, (action, restore) in zip(arms, done, strict=True):
        job = jobs[name]
        job.refresh_from_db()
        reached = max(
            JobProgress.objects.filter(job=job, at__lt=action.started_at or action.planned_at).values_list(
                "iteration", flat=True
            )
        )
        restored = restore.iteration if restore is not None else action.restore_iteration
        lost = max(0, reached - restored)
        out[name] = {
            "job": job,
            "action": action,
            "restore": restore,
            "reached": reached,
            "restored": restored,
            "lost_iterations": lost,
            "lost_seconds": lost * job.seconds_per_iteration,
            **(
                _in_place(folder / name, killed_at, job.seconds_per_iteration)
                if name == "protected" and standbys
                else {}
            ),
        }
        if "resumed" not in out[name]:
            resumed = json.loads((folder / name / "ckpt" / "ranks" / "1" / "resumed.json").read_text())
            out[name]["resumed"] = resumed
            out[name]["after"] = ranks(folder / name, 1)
            out[name]["resume_seconds"] = first_step_at(folder / name, 1) - killed_at
    return out


def _in_place(folder: Path, killed_at: float, step_seconds: float) -> dict:
    """An arm whose lost rank a standby replaced in place: what its runtime reported of it (the step it had reached,
    the one all resumed from, the steps redone), where its ranks run in the new generation, whether its survivor
    (rank 0) kept its process, and when it trained again (its first digest of generation 1)."""
    from jobs.local_slurm.training import checksums, in_job_events

    here = folder / "ckpt" / "ranks" / "0"
    after = [json.loads(p.read_text()) for p in sorted(here.glob("gen1-rank*.json"))]
    replaced = next(e for e in in_job_events(folder) if e["kind"] == "rank_replaced")
    return {
        "reached": replaced["reached"],
        "restored": replaced["iteration"],
        "lost_iterations": replaced["lost_iterations"],
        "lost_seconds": replaced["lost_iterations"] * step_seconds,
        "resumed": {"from": "memory, in place"},
        "after": after,
        "survivor_pids": (json.loads((here / "0.json").read_text())["pid"], after[0]["pid"]),
        "resume_seconds": min(c["at"] for c in checksums(folder) if c["generation"] == 1) - killed_at,
    }


def in_job_with_lockstep(
    slurm,
    cluster,
    folder: Path,
    *,
    launcher_token: str,
    url: str,
    timeout: float = 120,
) -> dict:
    """A node lost under a job with a standby in its allocation (issue 49), with Lockstep driving: the job (two
    ranks on n1 + n2, a standby on n3; n4 idle in the spare partition) registers and reports; once Lockstep has
    booked n3 as its standby and counts it protected, n2 dies (slurmd, rank, holder). The runtime's ``peer_lost``
    opens n2's incident, Lockstep decides rank_replacement (n2 drained with the incident's reason), the runtime puts
    the standby in rank 1's place and reports it, and beat starts a new standby on n4 (``replenish_standby``), which
    the job's next report books. The Slurm needs ``SlurmCluster(nodes=4, spare_nodes=1, holders=True)``; the
    control plane's environment must name the Python and agent the standby runs with (LOCKSTEP_PYTHON,
    PYTHONPATH), as a cluster's would. Returns what happened and when."""
    from jobs.choices import ActionKind, ActionState, FaultKind
    from jobs.local_slurm.training import checksums, in_job_events, kill_member, submit_in_job_training
    from jobs.models import FaultEvent, Job, JobProgress, JobStandby, RecoveryAction
    from jobs.protection import job_protection

    env = {"LOCKSTEP_URL": url, "LOCKSTEP_LAUNCHER_TOKEN": launcher_token}
    slurm_id = submit_in_job_training(slurm, folder, active=2, standbys=1, env=env)
    beat = functools.partial(beat_once, cluster)

    def protected_with_its_standby():
        job = Job.objects.filter(slurm__cluster=cluster, slurm__slurm_job_id=slurm_id).first()
        standbys = JobStandby.objects.filter(job=job, released_at__isnull=True).values_list(
            "node__hostname", flat=True
        )
        return (
            job
            if job and job.iteration >= 12 and list(standbys) == ["n3"] and job_protection(job).protected
            else None
        )

    job = _until(protected_with_its_standby, 150, "the job protected, with n3 as its standby", step=beat)
    before = ranks(folder, 0)
    killed_at, node = kill_member(slurm, folder, 1)

    def replaced_and_replenished():
        action = RecoveryAction.objects.filter(
            job=job, kind=ActionKind.RANK_REPLACEMENT, state=ActionState.SUCCEEDED, resumed_at__isnull=False
        ).first()
        if action is None or "standby" not in action.estimate:
            return None
        standbys = set(
            JobStandby.objects.filter(job=job, released_at__isnull=True).values_list(
                "node__hostname", flat=True
            )
        )
        progress = JobProgress.objects.filter(job=job, at__gt=action.resumed_at).first()
        return (action, progress) if progress and standbys == {"n4"} else None

    action, progress = _until(
        replaced_and_replenished, timeout, "the rank replaced and a new standby on n4", step=beat
    )
    job.refresh_from_db()
    faults = FaultEvent.objects.filter(cluster=cluster, node__hostname=node, kind=FaultKind.NODE_UNREACHABLE)
    fault = faults.order_by("received_at").first()
    events = {e["kind"]: e for e in in_job_events(folder)}
    replaced = events["rank_replaced"]
    trained = min(c["at"] for c in checksums(folder) if c["generation"] == 1)
    detected = _epoch(fault.received_at)
    started = _epoch(action.started_at or action.planned_at)
    return {
        "slurm_job_id": slurm_id,
        "job": job,
        "action": action,
        "fault": fault,
        "faults": list(faults),
        "node": node,
        "before": before,
        "peer_lost": events["peer_lost"],
        "rank_replaced": replaced,
        "first_progress": progress,
        "killed_at": killed_at,
        "seconds": {
            "notice": events["peer_lost"]["at"] - killed_at,  # a survivor's collective with rank 1 fails
            "detect": detected - killed_at,  # the first report of the node's loss reaches Lockstep
            "decide": started - detected,  # Lockstep decides rank_replacement and drains the node
            "replace": replaced["at"] - events["peer_lost"]["at"],  # new group, state from the peer, one step
            "total": trained - killed_at,  # the job's first parameter digest of the new generation
        },
    }
