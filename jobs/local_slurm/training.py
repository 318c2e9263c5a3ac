"""The training job the local Slurm runs (``agent/lockstep_agent/examples/train_slurm.sh``, two nodes, requeueable),
and the death of node ``n2`` under it: what ``manage.py slurm_demo`` does, and the Slurm tests and benchmarks too.

``ranks()`` reads what the job's ranks recorded of themselves (node, pid) under ``ckpt/ranks/<restart>/``.
``submit_in_job_training`` runs it with standbys in its allocation (a lost rank replaced in place).

**Replenishing a standby** (``submit_standby``; fleet/drivers/slurm.py's ``replenish_standby`` mirrors it): once a
standby has taken a lost rank's place, a new one is started as a one-node job of its own, on the spare partition::

    sbatch -p spare -N 1 --ntasks-per-node=1 -A <the job's account> --chdir <the job's working directory>
        --comment=lockstep-standby-for=<job id> -J standby-<job id> [-w <node>]
        <the job's batch script and arguments, as Slurm keeps them> --standby-for <job id>

The standby finds the job's store where the job's task 0 wrote it (``<checkpoint dir>/in_job/store.json``), takes
the next member number there and waits like the standbys of the allocation; the job's runtime gives it a lost
rank's place the same way, and the job's protection keys over the new process group from rank 0 (it needs no
secret of its own: the job secret the prolog derives for the comment's job is not used by the runtime). Its
environment must name the same Python and agent (``LOCKSTEP_PYTHON``, ``PYTHONPATH``) as the job's. It ends when
the job ends or falls back (the job's store says so, or is gone).
"""

import json
import shlex
import sys
from pathlib import Path

TRAIN_SCRIPT = (
    Path(__file__).resolve().parents[2] / "agent" / "lockstep_agent" / "examples" / "train_slurm.sh"
)
AGENT_DIR = TRAIN_SCRIPT.parents[2]


def _job_env(env: dict | None, **more) -> dict:
    """The environment a training (or standby) job needs: this Python and the agent, and what the caller adds."""
    return {"LOCKSTEP_PYTHON": sys.executable, "PYTHONPATH": str(AGENT_DIR), **more, **(env or {})}


def _sbatch_training(
    slurm,
    folder: Path,
    *,
    nodes: int,
    name: str,
    account: str,
    checkpoint_every: int,
    script_args: list[str],
    env: dict | None,
    sbatch_args: tuple[str, ...] = (),
) -> str:
    """sbatch train_slurm.sh on ``nodes`` nodes, one task each, requeueable, its output and checkpoints under
    ``folder``; returns the Slurm job id."""
    folder.mkdir(parents=True, exist_ok=True)
    answer = slurm.run(
        "sbatch",
        "--parsable",
        "-N",
        str(nodes),
        "--ntasks-per-node=1",
        *sbatch_args,
        "--requeue",
        "-A",
        account,
        "-J",
        name,
        "-o",
        str(folder / "job-%j.out"),
        str(TRAIN_SCRIPT),
        "--checkpoint-dir",
        str(folder / "ckpt"),
        "--checkpoint-every",
        str(checkpoint_every),
        *script_args,
        env=_job_env(env, MASTER_ADDR="127.0.0.1"),
    )
    return answer.stdout.strip().split(";")[0]


def submit_training(
    slurm,
    folder: Path,
    *,
    checkpoint_every: int = 20,
    env: dict | None = None,
    account: str = "acme",
    snapshot_every: int = 0,
) -> str:
    """sbatch the training job on two nodes (requeueable); returns its Slurm job id. With ``snapshot_every`` the
    job runs under the protection runtime, snapshotting every that many steps into its nodes' holders (the test
    Slurm must run them: ``SlurmCluster(holders=True)``)."""
    protection = (
        [
            "--protect-holder",
            slurm.holder_socket(),
            "--snapshot-every",
            str(snapshot_every),
            "--snapshot-report-interval",
            "0.5",
        ]
        if snapshot_every
        else []
    )
    return _sbatch_training(
        slurm,
        folder,
        nodes=2,
        name="train",
        account=account,
        checkpoint_every=checkpoint_every,
        script_args=["--min-step-seconds", "0.05", "--report-interval", "0.3", *protection],
        env=env,
    )


def ranks(folder: Path, restart: int) -> list[dict]:
    return [
        json.loads(p.read_text())
        for p in sorted((folder / "ckpt" / "ranks" / str(restart)).glob("[0-9]*.json"))
    ]


def kill_n2(slurm, folder: Path) -> tuple[float, list[dict]]:
    before = ranks(folder, 0)
    victims = [r["pid"] for r in before if r["node"] == "n2"]
    return slurm.kill_node("n2", victims), before


def submit_in_job_training(
    slurm,
    folder: Path,
    *,
    active: int = 2,
    standbys: int = 1,
    steps: int = 100_000,
    checkpoint_every: int = 20,
    env: dict | None = None,
    account: str = "acme",
) -> str:
    """sbatch the protected training job with ``standbys`` standbys in its allocation (``active + standbys``
    nodes, ``--no-kill``: a lost rank is replaced in place, lockstep_agent/protect/membership.py), a small model
    and a parameter digest per step (``checksums``); returns its Slurm job id."""
    return _sbatch_training(
        slurm,
        folder,
        nodes=active + standbys,
        name="train-in-job",
        account=account,
        checkpoint_every=checkpoint_every,
        script_args=[
            "--steps",
            str(steps),
            "--hidden",
            "64",
            "--min-step-seconds",
            "0.05",
            "--protect-holder",
            slurm.holder_socket(),
            "--snapshot-every",
            "1",
            "--snapshot-report-interval",
            "0.5",
            "--standbys",
            str(standbys),
            "--checksums",
        ],
        env=env,
        sbatch_args=("--no-kill",),
    )


def checksums(folder: Path) -> list[dict]:
    """The digest of the parameters rank 0 wrote after each step (a redone step appears again)."""
    path = folder / "ckpt" / "checksums.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def in_job_events(folder: Path, restart: int = 0, member: int = 0) -> list[dict]:
    """The in-place reports (peer_lost, rank_replaced, fallback) that member ``member`` wrote down."""
    path = folder / "ckpt" / "in_job" / str(restart) / f"events-{member}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_member(slurm, folder: Path, member: int, restart: int = 0) -> tuple[float, str]:
    """Kill the node task ``member`` (its SLURM_PROCID) runs on; returns when (epoch seconds) and the node."""
    me = json.loads((folder / "ckpt" / "ranks" / str(restart) / f"{member}.json").read_text())
    return slurm.kill_node(me["node"], [me["pid"]]), me["node"]


def submit_standby(slurm, slurm_job_id: str, node: str | None = None, env: dict | None = None) -> str:
    """Start a new standby for Slurm job ``slurm_job_id`` on the spare partition (``node`` to pin one), as the
    module docstring says; returns the standby job's id."""
    found = json.loads(slurm.run("squeue", "--json", "--jobs", slurm_job_id).stdout or "{}").get("jobs") or []
    if not found:
        raise RuntimeError(f"Slurm no longer knows job {slurm_job_id}")
    job = found[0]
    output = Path(job.get("standard_output") or job["current_working_directory"] + "/x").parent
    args = ["sbatch", "--parsable", "-p", "spare", "-N", "1", "--ntasks-per-node=1", "-A", job["account"]]
    args += ["--chdir", job["current_working_directory"], "-o", str(output / "standby-%j.out")]
    args += [f"--comment=lockstep-standby-for={slurm_job_id}", "-J", f"standby-{slurm_job_id}"]
    if node is not None:
        args += ["-w", node]
    answer = slurm.run(
        *args,
        *shlex.split(job["command"]),
        "--standby-for",
        slurm_job_id,
        env=_job_env(env),
    )
    return answer.stdout.strip().split(";")[0]
