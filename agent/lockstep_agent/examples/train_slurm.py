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

**Standbys** (``--standbys S``, with ``--protect-holder``; ``sbatch -N (N+S) --no-kill``): the last S tasks of the
allocation are standbys (``lockstep_agent.protect.membership``): torch imported, joined to the job's store, waiting.
When a node dies under an active rank, the survivors keep their processes and model, re-form the process group with
a standby in the lost rank's place, and every rank resumes from the newest iteration all can restore (the lost
rank's state from its peer's replica). Where that cannot be done (no standby left, both copies of a rank lost, the
store host lost) every rank exits with code 75 and the job takes the requeue path. Each rank writes
``ranks/<restart>/gen<g>-rank<r>.json`` (pid, node, member) when it joins generation g, and its in-place reports
to ``in_job/<restart>/events-<member>.jsonl``; ``--checksums`` has rank 0 write a digest of the parameters after
every step to ``checksums.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
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
    parser.add_argument(
        "--standbys",
        type=int,
        default=None,
        help="the last this many tasks are standbys; a lost rank is replaced in place (0: fall back at once)",
    )
    parser.add_argument(
        "--standby-for",
        default="",
        help="a standby started later, as a one-node job of its own: join this Slurm job's allocation",
    )
    parser.add_argument(
        "--checksums", action="store_true", help="rank 0 writes a digest of the parameters every step"
    )
    return parser.parse_args(argv)


FALLBACK_EXIT = 75  # in-place replacement impossible: the job takes the requeue path


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
    membership = None
    if args.standby_for:
        membership, ranks = _late_standby(args, node)
        rank = membership.member
    else:
        ranks = _announce(args, rank, node, restart)
    if args.standbys is not None:
        if membership is None:
            world -= args.standbys
            membership = _membership(args, rank, world, node)
        world = membership.active
        if membership.is_standby:
            print(f"member {rank} on {node}: standby", flush=True)
            (ranks / f"standby-{rank}.json").write_text(json.dumps({"pid": os.getpid(), "node": node}))
            rank = membership.wait_for_assignment()
            if rank is None:
                print(f"standby on {node}: released (the job ended or fell back)", flush=True)
                return 0
        membership.init_process_group(rank)
        _joined(ranks, membership, node)
    reporter, snapshot_reporter = _reporters(args, rank)
    if membership is None:
        master = f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ['MASTER_PORT']}"
        dist.init_process_group(
            "gloo", init_method=master, rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
    model, optimizer = _model(args)
    protect = None
    if args.protect_holder:
        protect = _protection(args, model, optimizer, rank, node, snapshot_reporter, membership)
    step = _resume(args, model, optimizer, protect, reporter, rank, ranks)
    from lockstep_agent.protect.membership import Fallback

    try:
        if _train(args, model, optimizer, protect, reporter, rank, world, ranks, step):
            return 3  # written through and not moved: Slurm requeues the job or it ends
    except Fallback as fallback:
        _record_events(args, protect, membership)
        print(f"rank {rank}: falling back to a relaunch: {fallback.reason}", flush=True)
        return FALLBACK_EXIT
    if reporter is not None:
        reporter.flush()
    if protect is not None:
        protect.close()
    if membership is not None:
        membership.finish()
    dist.destroy_process_group()
    return 0


def _job_name(args: argparse.Namespace) -> str:
    """The job's name for its runtime (a replenishing standby's is the job's it joins)."""
    return f"slurm-{args.standby_for or os.environ.get('SLURM_JOB_ID', 'job')}"


def _membership(args: argparse.Namespace, member: int, active: int, node: str):
    """This task's place in an allocation with standbys (the job's store, hosted by task 0, which writes where
    it is to ``in_job/store.json`` for standbys started later)."""
    from lockstep_agent.protect.membership import Membership

    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"])
    key = _standby_key(args) if member >= active else None
    membership = Membership(
        member=member, active=active, node=node, job=_job_name(args), host=host, port=port, key=key
    )
    if member == 0:
        membership.announce_total(int(os.environ["SLURM_NTASKS"]))
        store = {
            "host": host,
            "port": port,
            "active": active,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        }
        folder = args.checkpoint_dir / "in_job"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "store.json.tmp").write_text(json.dumps(store))
        os.replace(folder / "store.json.tmp", folder / "store.json")
    return membership


def _standby_key(args: argparse.Namespace, timeout: float = 600.0) -> bytes:
    """The job's heartbeat key, with which a standby proves it is the job's: from the job's protection secret
    (``LOCKSTEP_PROTECT_SECRET``…, or the key file rank 0 creates in the checkpoint folder: waited for)."""
    from lockstep_agent.protect import keys

    secret = keys.configured_secret()
    path = keys.default_secret_file(str(args.checkpoint_dir / "protect"), _job_name(args))
    deadline = time.monotonic() + timeout
    while secret is None:
        if os.path.exists(path):
            secret = keys.read_secret_file(path)
        elif time.monotonic() > deadline:
            raise SystemExit(f"no protection secret for the job: {path} never appeared")
        else:
            time.sleep(0.2)
    return keys.derive(keys.root(secret), _job_name(args)).beat


def _late_standby(args: argparse.Namespace, node: str):
    """A standby started later, as a job of its own (``--standby-for``): join the job's store (where its
    ``in_job/store.json`` says) under the next free member number; its membership and the job's ranks folder."""
    from lockstep_agent.protect.membership import Membership

    store = json.loads((args.checkpoint_dir / "in_job" / "store.json").read_text())
    if str(store["slurm_job_id"]) != str(args.standby_for):
        raise SystemExit(
            f"{args.checkpoint_dir} belongs to Slurm job {store['slurm_job_id']}, not {args.standby_for}"
        )
    membership = Membership(
        member=-1,
        active=store["active"],
        node=node,
        job=_job_name(args),
        host=store["host"],
        port=store["port"],
        key=_standby_key(args),
    )
    os.environ["SLURM_RESTART_COUNT"] = str(store["restart"])  # the job's launch it serves
    return membership, _announce(args, membership.member, node, store["restart"])


def _joined(ranks: Path, membership, node: str) -> None:
    """Write down who this process is in the current generation (its pid: a survivor's never changes)."""
    rank = membership.rank
    me = {"rank": rank, "member": membership.member, "pid": os.getpid(), "node": node}
    (ranks / f"gen{membership.generation}-rank{rank}.json").write_text(json.dumps(me))
    print(
        f"generation {membership.generation}: rank {rank} is member {membership.member} on {node}", flush=True
    )


def _record_events(args: argparse.Namespace, protect, membership) -> None:
    """Append the runtime's in-place reports not yet written (tests read them without a Lockstep)."""
    if protect is None or membership is None:
        return
    written = getattr(protect, "_events_written", 0)
    if written == len(protect.events):
        return
    folder = args.checkpoint_dir / "in_job" / os.environ.get("SLURM_RESTART_COUNT", "0")
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"events-{membership.member}.jsonl").open("a") as out:
        for event in protect.events[written:]:
            out.write(json.dumps(event) + "\n")
    protect._events_written = len(protect.events)


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
    model = _wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def _protection(
    args: argparse.Namespace, model, optimizer, rank: int, node: str, snapshot_reporter, membership=None
):
    """The protection runtime around the loop, restored from memory where it can be (said on stdout)."""
    from lockstep_agent.protect import Protection

    protect = Protection(
        model,
        optimizer,
        every=args.snapshot_every,
        holder=args.protect_holder.replace("{node}", node),
        node=node,
        job=_job_name(args),
        checkpoint_dir=str(args.checkpoint_dir / "protect"),
        # With standbys a fallback may find both copies of a rank gone: the runtime keeps its own disk copies.
        disk_every=args.checkpoint_every if membership is not None else 0,
        reporter=snapshot_reporter if rank == 0 else None,
        membership=membership,
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
        resumed = {"step": step, "from": resumed_from, "at": time.time()}
        if args.checksums:
            resumed["sha256"] = _digest(model)
        (ranks / "resumed.json").write_text(json.dumps(resumed))
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
    for a write-through and the job was held for it (the loop ends there). With standbys, a failed collective is
    recovered in place (``Protection.recover``: the same process, the same module and optimizer, a new process
    group) and training goes on from the iteration every rank restored."""
    import torch

    target = torch.randn(64, 1, generator=torch.Generator().manual_seed(1))
    first_step = True
    in_place = protect is not None and protect.membership is not None
    while step < args.steps:
        started = time.monotonic()
        try:
            step = _one_step(args, model, optimizer, protect, reporter, rank, world, step, target)
        except RuntimeError as error:  # a collective failed (gloo's error, or the replication thread's)
            if not in_place or isinstance(error, _fallback_type()):
                raise
            model = protect.recover(error, functools.partial(_wrap, model.module))
            _record_events(args, protect, protect.membership)
            _joined(ranks, protect.membership, protect.node)
            step = protect.start_iteration
            continue
        if step < 0:
            return True
        if in_place:
            _record_events(args, protect, protect.membership)
        if args.checksums and rank == 0:
            _write_checksum(args, model, step, protect)
        spent = time.monotonic() - started
        if spent < args.min_step_seconds:
            time.sleep(args.min_step_seconds - spent)
        if reporter is not None:
            reporter.report(
                step, step_seconds=time.monotonic() - started, checkpoint=step % args.checkpoint_every == 0
            )
        if first_step and rank == 0:
            # When this run trained its first step (a restart's end, as the job itself sees it).
            (ranks / "first_step.json").write_text(json.dumps({"step": step, "at": time.time()}))
        first_step = False
    return False


def _fallback_type():
    from lockstep_agent.protect.membership import Fallback

    return Fallback


def _wrap(module):
    """The module under DistributedDataParallel in the current process group."""
    from torch import nn

    return nn.parallel.DistributedDataParallel(module)


def _one_step(args, model, optimizer, protect, reporter, rank: int, world: int, step: int, target) -> int:
    """Train step ``step + 1`` (snapshot, checkpoint); returns it, or -1 when held for a write-through."""
    import torch
    from torch import nn

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
        return -1
    if protect is not None:
        protect.step(step)
    if step % args.checkpoint_every == 0:
        _checkpoint(args, model, optimizer, rank, step)
    return step


def _digest(model) -> str:
    """A digest of every parameter's bytes (equal between two runs exactly when their parameters are)."""
    digest = hashlib.sha256()
    for parameter in model.module.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    return digest.hexdigest()[:32]


def _write_checksum(args: argparse.Namespace, model, step: int, protect) -> None:
    """A digest of every parameter's bytes after ``step`` (equal between two runs exactly when their states are)."""
    generation = protect.membership.generation if protect is not None and protect.membership else 0
    line = {
        "step": step,
        "sha256": _digest(model),
        "pid": os.getpid(),
        "generation": generation,
        "at": time.time(),
    }
    with (args.checkpoint_dir / "checksums.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")


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
