"""The training job the local Slurm runs (``agent/lockstep_agent/examples/train_slurm.sh``, two nodes, requeueable),
and the death of node ``n2`` under it: what ``manage.py slurm_demo`` does, and the Slurm tests and benchmarks too.

``ranks()`` reads what the job's ranks recorded of themselves (node, pid) under ``ckpt/ranks/<restart>/``.
"""

import json
import sys
from pathlib import Path

TRAIN_SCRIPT = (
    Path(__file__).resolve().parents[2] / "agent" / "lockstep_agent" / "examples" / "train_slurm.sh"
)
AGENT_DIR = TRAIN_SCRIPT.parents[2]


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
    folder.mkdir(parents=True, exist_ok=True)
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
        *protection,
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


def kill_n2(slurm, folder: Path) -> tuple[float, list[dict]]:
    before = ranks(folder, 0)
    victims = [r["pid"] for r in before if r["node"] == "n2"]
    return slurm.kill_node("n2", victims), before
