"""A test model, its training worker and a launcher of "nodes", shared by the runtime's tests and benchmark.

The model has about 5 MB of parameters (1.25 M float32 parameters) and, with ``torch.set_num_threads(1)``, a step of a few
hundred milliseconds at the default batch. A *node* is a process group holding that node's snapshot holder and
its training process: killing the group kills both, so nothing of the node survives.

    python -m lockstep_agent.protect.testing worker --rank 0 --world 3 --holder /tmp/n0.sock --log /tmp/r0.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from lockstep_agent.protect import state as packing
from lockstep_agent.protect.runtime import Protection
from lockstep_agent.snapshot_holder import HolderClient

FEATURES = 256


class TestModel(nn.Module):
    """1,247,232 parameters (4.99 MB of float32) with dropout, so a step draws from the RNG."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, 1024),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(1024, 768),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(768, FEATURES),
        )

    def forward(self, x):
        return self.layers(x)


class SyntheticData:
    """Batch *i* of rank *r* depends only on (seed, r, i): the data position is one integer."""

    def __init__(self, rank: int, batch: int, seed: int = 7):
        self.rank, self.batch, self.seed, self.position = rank, batch, seed, 0
        teacher = torch.Generator().manual_seed(seed)
        self.teacher = torch.randn(FEATURES, FEATURES, generator=teacher) / FEATURES**0.5

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 10_007 + self.position)
        self.position += 1
        x = torch.randn(self.batch, FEATURES, generator=generator)
        return x, torch.tanh(x @ self.teacher)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])


def parameter_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# --- the worker: one rank ---------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    emit = _event_log(args)
    dist.init_process_group(
        "gloo",
        rank=args.rank,
        world_size=args.world,
        timeout=__import__("datetime").timedelta(seconds=args.timeout),
    )
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TestModel()
    # DistributedDataParallel, or one flat all-reduce of every gradient: DDP re-buckets its gradients after the
    # first iteration of each launch, which changes gloo's summation order, so only the flat all-reduce trains
    # bit for bit the same across a relaunch (the tests compare against a run never interrupted).
    ddp = nn.parallel.DistributedDataParallel(model) if args.ddp else model
    parameters = list(model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = SyntheticData(args.rank, args.batch, args.seed)
    torch.manual_seed(args.seed + 1 + args.rank)  # dropout differs per rank
    protect, start = _protect(args, ddp, optimizer, data, emit)
    step_times = _train(args, ddp, parameters, optimizer, data, protect, start, emit)
    final = {"iteration": args.iterations, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
    figures = {}
    if protect is not None:
        protect.close()
        figures = {
            "capture": protect.capture_seconds,
            "replication": protect.replication_seconds,
            "blocked": protect.blocked_seconds,
            "skipped": protect.snapshots_skipped,
        }
    emit("done", digest=packing.digest(final), step_seconds=step_times, **figures)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _event_log(args: argparse.Namespace):
    """``emit(event, **values)``: one JSON line of this rank's in the log the tests read."""
    log = open(args.log, "a", buffering=1)

    def emit(event: str, **values):
        log.write(json.dumps({"event": event, "rank": args.rank, "t": time.time(), **values}) + "\n")

    return emit


def _protect(args: argparse.Namespace, ddp, optimizer, data, emit) -> tuple[Protection | None, int]:
    """The runtime (None with --unprotected), restored, and the iteration training resumes after."""
    if args.unprotected:
        emit("start", kind="unprotected", iteration=0)
        return None, 0
    protect = Protection(
        ddp,
        optimizer,
        every=args.every,
        stateful={"data": data},
        holder=args.holder,
        node=args.node,
        checkpoint_dir=args.checkpoint_dir,
        disk_every=args.disk_every,
        job=args.job,
        hang_factor=args.hang_factor,
        hang_min_seconds=args.hang_min_seconds,
        on_hang=lambda report: emit("hang", **report.__dict__),
    )
    restored = protect.restored
    emit(
        "start",
        kind=restored.kind,
        iteration=restored.iteration,
        seconds=restored.seconds,
        sources={str(k): v for k, v in restored.sources.items()},
        reason=restored.reason,
        digest=packing.digest(protect.state_dict(restored.iteration)) if args.digests else None,
    )
    return protect, protect.start_iteration


def _train(
    args: argparse.Namespace, ddp, parameters, optimizer, data, protect, start: int, emit
) -> list[float]:
    """Train from ``start + 1`` to ``--iterations``, stalling where told; returns each step's seconds."""
    loss_fn = nn.MSELoss()
    step_times = []
    for iteration in range(start + 1, args.iterations + 1):
        began = time.perf_counter()
        x, y = data.next()
        if args.stall_rank == args.rank and iteration == args.stall_at:
            emit("stalling", iteration=iteration)
            time.sleep(args.stall_seconds)
        loss = loss_fn(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not args.ddp:
            if protect is not None:
                protect.mark_sync()
            flat = torch.cat([p.grad.reshape(-1) for p in parameters]).mul_(1.0 / args.world)
            dist.all_reduce(flat)
            offset = 0
            for p in parameters:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        optimizer.step()
        if protect is not None:
            protect.step(iteration)
        step_times.append(time.perf_counter() - began)
        if (
            args.digests and protect is not None and iteration % args.every == 0
        ):  # before "step": see the tests
            emit("digest", iteration=iteration, digest=packing.digest(protect.state_dict(iteration)))
        emit("step", iteration=iteration, loss=float(loss.detach()), seconds=step_times[-1])
    return step_times


def worker_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lockstep_agent.protect.testing worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--node", default=None)
    parser.add_argument("--holder", default=None)
    parser.add_argument("--log", required=True)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--job", default="test")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--disk-every", type=int, default=0)
    parser.add_argument("--hang-factor", type=float, default=5.0)
    parser.add_argument("--hang-min-seconds", type=float, default=5.0)
    parser.add_argument("--stall-rank", type=int, default=-1)
    parser.add_argument("--stall-at", type=int, default=-1)
    parser.add_argument("--stall-seconds", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument(
        "--ddp", action="store_true", help="DistributedDataParallel instead of a flat all-reduce"
    )
    parser.add_argument("--digests", action="store_true", help="log a digest of the state at every snapshot")
    parser.add_argument(
        "--unprotected", action="store_true", help="train without the runtime (benchmark baseline)"
    )
    return parser.parse_args(argv)


# --- nodes: a holder and a training process, killed as one ---------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    label: str
    socket_path: str
    holder: subprocess.Popen
    trainer: subprocess.Popen | None = None
    logs: list[str] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.holder.poll() is None

    def kill(self) -> None:
        """The node dies: its holder and its training process together (SIGKILL to the process group)."""
        try:
            os.killpg(self.holder.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.holder.wait(10)
        if self.trainer is not None:
            self.trainer.wait(10)

    def stop_trainer(self) -> None:
        """The job's training process ends (a relaunch), the holder stays."""
        if self.trainer is not None and self.trainer.poll() is None:
            self.trainer.kill()
        if self.trainer is not None:
            self.trainer.wait(10)


STARTED: list[Node] = []  # every node this process started, for kill_all


def kill_all() -> None:
    """Kill every node this process started that is still alive (test teardown)."""
    while STARTED:
        node = STARTED.pop()
        if node.alive or (node.trainer is not None and node.trainer.poll() is None):
            node.kill()


def start_node(folder: str, label: str, env: dict | None = None) -> Node:
    path = os.path.join(folder, f"{label}.sock")
    holder = subprocess.Popen(
        [sys.executable, "-m", "lockstep_agent.snapshot_holder", "--socket", path],
        process_group=0,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(folder, f"{label}.holder.log"), "a"),
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            client = HolderClient(path, timeout=2)
            client.ping()
            client.close()
            STARTED.append(Node(label, path, holder))
            return STARTED[-1]
        except OSError:
            if holder.poll() is not None:
                raise RuntimeError(f"holder {label} exited with {holder.returncode}") from None
            time.sleep(0.05)
    raise RuntimeError(f"holder {label} did not start")


def launch(
    nodes: list[Node], folder: str, extra: list[str], *, env: dict | None = None, tag: str = ""
) -> str:
    """Start one training process per node (rank = position) inside that node's process group."""
    port = free_port()
    environment = dict(env or os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for rank, node in enumerate(nodes):
        log = os.path.join(folder, f"rank{rank}{tag}.jsonl")
        node.logs.append(log)
        node.trainer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lockstep_agent.protect.testing",
                "worker",
                "--rank",
                str(rank),
                "--world",
                str(len(nodes)),
                "--node",
                node.label,
                "--holder",
                node.socket_path,
                "--log",
                log,
                *extra,
            ],
            process_group=node.holder.pid,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(folder, f"rank{rank}{tag}.stderr"), "a"),
        )
    return str(port)


def events(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.endswith("\n")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "worker":
        print(__doc__)
        return 2
    return worker(worker_arguments(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
