"""The node-death scenario on a real Slurm, with and without Lockstep (tests/slurm and bench/slurm_recovery.py).

The training job (agent/lockstep_agent/examples/train_slurm.py) runs on two nodes; once it has checkpointed and
trained past its checkpoint, node ``n2`` dies: its slurmd, its step daemon and its rank are killed at once.

- ``with_lockstep``: beat's work is done here in a loop (the Slurm sync, fault handling, recovery advance; each
  what a beat task calls) until the job trains again on the spare, and the phases are timed from what was
  recorded: the fault's detection, the action's start and end, the job's first step after the restart.
- ``without_lockstep``: nothing but Slurm: the job is watched until Slurm requeues it and it trains again, or it
  is lost (ended, not requeued) — by the partition's policy and ``SlurmdTimeout``.

Apps are imported inside the functions (controlplane imports no app at import time).
"""

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

TRAIN_SCRIPT = (
    Path(__file__).resolve().parents[2] / "agent" / "lockstep_agent" / "examples" / "train_slurm.sh"
)
AGENT_DIR = TRAIN_SCRIPT.parents[2]


def submit_training(
    slurm, folder: Path, *, checkpoint_every: int = 20, env: dict | None = None, account: str = "acme"
) -> str:
    """sbatch the training job on two nodes (requeueable); returns its Slurm job id."""
    folder.mkdir(parents=True, exist_ok=True)
    answer = slurm.run(
        "sbatch",
        "--parsable",
        "-N",
        "2",
        "--ntasks-per-node=1",
        "--requeue",
        "-A",
        account,
        "-J",
        "train",
        "-o",
        str(folder / "job-%j.out"),
        str(TRAIN_SCRIPT),
        "--checkpoint-dir",
        str(folder / "ckpt"),
        "--checkpoint-every",
        str(checkpoint_every),
        "--min-step-seconds",
        "0.05",
        "--report-interval",
        "0.3",
        env={
            "LOCKSTEP_PYTHON": sys.executable,
            "PYTHONPATH": str(AGENT_DIR),
            "MASTER_ADDR": "127.0.0.1",
            **(env or {}),
        },
    )
    return answer.stdout.strip().split(";")[0]


def ranks(folder: Path, restart: int) -> list[dict]:
    return [
        json.loads(p.read_text())
        for p in sorted((folder / "ckpt" / "ranks" / str(restart)).glob("[0-9]*.json"))
    ]


def first_step_at(folder: Path, restart: int) -> float | None:
    path = folder / "ckpt" / "ranks" / str(restart) / "first_step.json"
    try:
        return json.loads(path.read_text())["at"]
    except (OSError, ValueError, KeyError):
        return None


def squeue_job(slurm, slurm_id: str) -> dict | None:
    jobs = json.loads(
        slurm.run("squeue", "--json", "--all", "--jobs", slurm_id, check=False).stdout or "{}"
    ).get("jobs")
    return jobs[0] if jobs else None


def _until(predicate, timeout: float, what: str, step=None, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if step is not None:
            step()
        found = predicate()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def _epoch(moment: datetime) -> float:
    return moment.astimezone(UTC).timestamp()


def kill_n2(slurm, folder: Path) -> tuple[float, list[dict]]:
    before = ranks(folder, 0)
    victims = [r["pid"] for r in before if r["node"] == "n2"]
    return slurm.kill_node("n2", victims), before


def with_lockstep(
    slurm,
    cluster,
    folder: Path,
    *,
    launcher_token: str,
    url: str,
    checkpoint_every: int = 20,
    timeout: float = 150,
) -> dict:
    """Run the scenario under Lockstep; returns what happened and when (epoch seconds and durations)."""
    from jobs.choices import ActionKind
    from jobs.models import FaultEvent, Job, JobProgress, RecoveryAction, SlurmJob
    from jobs.services.advance import recovery_advance
    from jobs.services.faults import fault_handle
    from jobs.services.slurm_jobs import slurm_sync

    slurm_id = submit_training(
        slurm,
        folder,
        checkpoint_every=checkpoint_every,
        env={"LOCKSTEP_URL": url, "LOCKSTEP_LAUNCHER_TOKEN": launcher_token},
    )

    def beat():
        result = slurm_sync(cluster=cluster)
        for fault_id in result.get("faults", []):
            fault_handle(fault_id=fault_id)
        for fault_id in FaultEvent.objects.filter(cluster=cluster, state="new").values_list("pk", flat=True):
            fault_handle(fault_id=fault_id)
        recovery_advance(cluster_ids=[cluster.pk])

    def trained_past_checkpoint():
        job = Job.objects.filter(slurm__cluster=cluster, slurm__slurm_job_id=slurm_id).first()
        return (
            job
            if job
            and job.last_checkpoint_iteration >= 2 * checkpoint_every
            and job.iteration >= job.last_checkpoint_iteration + checkpoint_every // 2
            else None
        )

    job = _until(trained_past_checkpoint, 120, "the job to train past its second checkpoint", step=beat)
    iteration_at_fault, checkpoint_at_fault = job.iteration, job.last_checkpoint_iteration
    killed_at, before = kill_n2(slurm, folder)

    def restarted():
        action = (
            RecoveryAction.objects.filter(job=job, kind=ActionKind.RESTART_FROM_CHECKPOINT, state="succeeded")
            .order_by("-ended_at")
            .first()
        )
        if action is None or first_step_at(folder, 1) is None:
            return None
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
        "seconds": {
            "detect": detected - killed_at,  # Slurm's ping fails; the sync stores the fault
            "decide": started - detected,  # Lockstep decides and starts the requeue
            "slurm_requeue": ended - started,  # drain, requeue without n2, Slurm runs it on the spare
            "job_restart": trained - ended,  # the job's own restart: Python, torch, gloo, checkpoint
            "total": trained - killed_at,
        },
    }


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
