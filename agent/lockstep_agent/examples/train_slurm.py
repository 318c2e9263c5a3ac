"""A small real training job for Slurm: torch.distributed (gloo) across the nodes of its allocation.

Launched by ``sbatch`` through ``train_slurm.sh`` (one ``srun`` task per node)::

    sbatch -N 2 --ntasks-per-node=1 --requeue agent/lockstep_agent/examples/train_slurm.sh \
        --checkpoint-dir /shared/ckpt --checkpoint-every 20

Each rank writes ``<checkpoint-dir>/ranks/<restart>/<rank>.json`` with its pid and ``SLURMD_NODENAME`` at start
(and prints it), so a test can end one node's ranks. Rank 0 checkpoints (model and optimizer, written to a
temporary file and renamed) every ``--checkpoint-every`` steps, and every rank resumes from the newest checkpoint
when Slurm requeues the job. With ``LOCKSTEP_URL`` and ``LOCKSTEP_LAUNCHER_TOKEN`` set, rank 0 registers the job
with Lockstep (``lockstep_agent.launcher``) and reports progress through ``lockstep_agent.progress``.

The model is a four-layer MLP of about 1 M parameters (4 MB); data is drawn from a generator seeded by the step,
so a resumed run sees the same batches it would have.

**Protected** (``--protect-holder``): the loop is wrapped by the protection runtime (``lockstep_agent.protect``):
every ``--snapshot-every`` steps each rank's state is snapshotted into its node's snapshot holder and replicated
to the peer node; a relaunch (Slurm requeues the job, Lockstep without the lost node) restores from memory — the
lost node's rank from its peer's replica — and only falls back to the disk checkpoint when both copies are gone.
The holder is a node daemon started outside the job (one per node, like slurmd); ``--protect-holder`` names its
socket, ``{node}`` replaced by ``SLURMD_NODENAME``. Rank 0 reports restore points and restores with the job token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    parser.add_argument("--steps", type=int, default=1_000_000, help="stop after this many steps")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--report-interval",
        type=float,
        default=0.5,
        help="seconds between progress reports (checkpoints are always reported)",
    )
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="pad each step to at least this long (the tests use it to keep two CPUs usable)",
    )
    parser.add_argument(
        "--protect-holder",
        default=os.environ.get("LOCKSTEP_PROTECT_HOLDER", ""),
        help="the node's snapshot holder socket ({node}: SLURMD_NODENAME); turns the protection runtime on",
    )
    parser.add_argument("--snapshot-every", type=int, default=1, help="steps between in-memory snapshots")
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=300.0,
        help="after a write-through Lockstep asked for, wait this long to be moved before giving up",
    )
    parser.add_argument(
        "--snapshot-report-interval",
        type=float,
        default=float(os.environ.get("LOCKSTEP_PROTECT_INTERVAL", "10")),
        help="at most one restore-point report to Lockstep per this many seconds",
    )
    return parser.parse_args(argv)


def newest_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("ckpt-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    node = os.environ.get("SLURMD_NODENAME", "")
    ranks = _announce(args, rank, node, restart)
    reporter, snapshot_reporter = _reporters(args, rank)
    master = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
    dist.init_process_group(
        "gloo", init_method=master, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    model, optimizer = _model(args)
    protect = None
    if args.protect_holder:
        protect = _protection(args, model, optimizer, rank, node, snapshot_reporter)
    step = _resume(args, model, optimizer, protect, reporter, rank, ranks)
    if _train(args, model, optimizer, protect, reporter, rank, world, ranks, step):
        return 3  # written through and not moved: Slurm requeues the job or it ends
    if reporter is not None:
        reporter.flush()
    if protect is not None:
        protect.close()
    dist.destroy_process_group()
    return 0


def _announce(args: argparse.Namespace, rank: int, node: str, restart: int) -> Path:
    """Write (and print) this rank's pid and node for this restart, so a test can end one node's ranks;
    returns the restart's folder of such files."""
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    ranks = args.checkpoint_dir / "ranks" / str(restart)
    ranks.mkdir(parents=True, exist_ok=True)
    me = {
        "rank": rank,
        "pid": os.getpid(),
        "node": node,
        "restart": restart,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
    (ranks / f"{rank}.json").write_text(json.dumps(me))
    print(f"rank {rank} pid {me['pid']} node {node} restart {restart}", flush=True)
    return ranks


def _reporters(args: argparse.Namespace, rank: int):
    """Rank 0's progress reporter and restore-point reporter, once it has registered the job with Lockstep
    (None each elsewhere, or without LOCKSTEP_URL and LOCKSTEP_LAUNCHER_TOKEN)."""
    reporter = snapshot_reporter = None
    if rank == 0 and os.environ.get("LOCKSTEP_URL") and os.environ.get("LOCKSTEP_LAUNCHER_TOKEN"):
        from lockstep_agent.launcher import register_slurm_job
        from lockstep_agent.progress import ProgressReporter

        job_id, job_token = register_slurm_job()
        reporter = ProgressReporter(
            os.environ["LOCKSTEP_URL"], job_id, job_token, min_interval=args.report_interval
        )
        print(f"registered as Lockstep job {job_id}", flush=True)
        if args.protect_holder:
            from lockstep_agent.protect.report import SnapshotReporter

            snapshot_reporter = SnapshotReporter(
                os.environ["LOCKSTEP_URL"], job_id, job_token, min_interval=args.snapshot_report_interval
            )
    return reporter, snapshot_reporter


def _model(args: argparse.Namespace):
    """The four-layer MLP (the same initial weights on every rank) under DistributedDataParallel, and SGD."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, args.hidden),
        nn.ReLU(),
        nn.Linear(args.hidden, 1),
    )
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def _protection(args: argparse.Namespace, model, optimizer, rank: int, node: str, snapshot_reporter):
    """The protection runtime around the loop, restored from memory where it can be (said on stdout)."""
    from lockstep_agent.protect import Protection

    protect = Protection(
        model,
        optimizer,
        every=args.snapshot_every,
        holder=args.protect_holder.replace("{node}", node),
        node=node,
        job=f"slurm-{os.environ.get('SLURM_JOB_ID', 'job')}",
        checkpoint_dir=str(args.checkpoint_dir / "protect"),
        reporter=snapshot_reporter if rank == 0 else None,
    )
    restored = protect.restored
    print(
        f"rank {rank} protection: {restored.kind} at step {restored.iteration} "
        f"({restored.sources.get(rank, restored.reason)}) in {restored.seconds:.3f}s",
        flush=True,
    )
    return protect


def _resume(args: argparse.Namespace, model, optimizer, protect, reporter, rank: int, ranks: Path) -> int:
    """The step to go on from: the protection runtime's restore from memory where it is no older than the
    newest checkpoint, else that checkpoint, else 0. Reported to Lockstep, and written down by rank 0."""
    import torch

    step, resumed_from = 0, "fresh"
    latest = newest_checkpoint(args.checkpoint_dir)
    if (
        protect is not None
        and protect.restored.kind == "snapshot"
        and (latest is None or protect.start_iteration >= int(latest.stem.split("-")[1]))
    ):
        step, latest, resumed_from = protect.start_iteration, None, "memory"
        print(f"rank {rank} restored from memory at step {step}", flush=True)
    elif latest is not None:
        resumed_from = "disk"
        state = torch.load(latest, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        print(f"rank {rank} resumed from {latest.name} at step {step}", flush=True)
    if reporter is not None:
        reporter.report(step, checkpoint=latest is not None)
    if rank == 0:
        (ranks / "resumed.json").write_text(
            json.dumps({"step": step, "from": resumed_from, "at": time.time()})
        )
    return step


def _moving(reporter) -> bool:
    """Every rank at once: has Lockstep asked (in its answer to rank 0's last progress report) to write
    through? One small broadcast a step."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if reporter is not None and reporter.answer.get("write_through") else 0])
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def _train(
    args: argparse.Namespace,
    model,
    optimizer,
    protect,
    reporter,
    rank: int,
    world: int,
    ranks: Path,
    step: int,
) -> bool:
    """Train from ``step`` to ``--steps``, checkpointing and reporting as it goes. True when Lockstep asked
    for a write-through and the job was held for it (the loop ends there)."""
    import torch
    from torch import nn

    target = torch.randn(64, 1, generator=torch.Generator().manual_seed(1))
    first_step = True
    while step < args.steps:
        started = time.monotonic()
        generator = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(args.batch, 64, generator=generator)
        loss = nn.functional.mse_loss(model(x), x @ target)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients over gloo
        optimizer.step()
        step += 1
        if protect is not None and _moving(reporter):
            _write_through_and_hold(args, protect, reporter, rank, step, started)
            return True
        if protect is not None:
            protect.step(step)
        saved = False
        if step % args.checkpoint_every == 0:
            _checkpoint(args, model, optimizer, rank, step)
            saved = True
        spent = time.monotonic() - started
        if spent < args.min_step_seconds:
            time.sleep(args.min_step_seconds - spent)
        if reporter is not None:
            reporter.report(step, step_seconds=time.monotonic() - started, checkpoint=saved)
        if first_step and rank == 0:
            # When this run trained its first step (a restart's end, as the job itself sees it).
            (ranks / "first_step.json").write_text(json.dumps({"step": step, "at": time.time()}))
        first_step = False
    return False


def _write_through_and_hold(
    args: argparse.Namespace, protect, reporter, rank: int, step: int, started: float
) -> None:
    """Lockstep moves the job off a node predicted to fail: snapshot this step, write it through, hold until
    the relaunch (which restores this step from memory: nothing is lost)."""
    protect.request_write_through()
    protect.step(step)
    protect.write_through()
    if reporter is not None:
        reporter.report(step, step_seconds=time.monotonic() - started, force=True)
        reporter.flush()
    protect.close()
    print(f"rank {rank} wrote through at step {step}; held for Lockstep to move the job", flush=True)
    time.sleep(args.hold_seconds)


def _checkpoint(args: argparse.Namespace, model, optimizer, rank: int, step: int) -> None:
    """Rank 0 writes the checkpoint (to a temporary file, then renamed); every rank waits for it."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        path = args.checkpoint_dir / f"ckpt-{step}.pt"
        partial = path.with_suffix(".tmp")
        torch.save(
            {"step": step, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
            partial,
        )
        os.replace(partial, path)
    dist.barrier()


if __name__ == "__main__":
    sys.exit(main())
