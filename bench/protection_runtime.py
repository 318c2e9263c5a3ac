"""Benchmark: what the protection runtime (lockstep_agent.protect) costs a training step, how long a restore
takes, and how many iterations a lost node costs against restarting from a disk checkpoint.

Three ranks train the runtime's test model (5 MB of parameters, Adam: 15 MB of state per rank) over gloo on
this machine, one thread each, each rank on a "node" (its snapshot holder and its training process in one
process group). Real processes, real gloo; no Lockstep needed.

1. Step time: the same run unprotected, with a snapshot every step, every N steps, and every step written
   through to disk as well; the median step time of each rank after the first few steps.
2. Restore and loss: a job snapshotting every ``--every-kill`` steps and writing a disk checkpoint every
   ``--disk-every`` steps loses a node at a random iteration ``--kills`` times; for each: the iterations lost
   (last iteration finished − iteration restored), what restarting from the newest disk checkpoint would have
   lost, and the time the restore took. Then both nodes of a replica pair die once: the disk fallback's time.

    .venv/bin/python bench/protection_runtime.py                          # about 6 minutes on 2 cores
    .venv/bin/python bench/protection_runtime.py --iterations 30 --kills 2 --batch 1024
"""

import argparse
import json
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "agent"))
# The holders and training processes import this checkout's agent too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "agent"), os.environ.get("PYTHONPATH")]))
# The jobs' protection secret, as a launcher gives it (one per benchmark: each run is a job of its own name).
os.environ.setdefault("LOCKSTEP_PROTECT_SECRET", secrets.token_hex(32))

from lockstep_agent.protect import testing  # noqa: E402

WORLD = 3


def _events(nodes, index=-1):
    return [e for node in nodes for e in testing.events(node.logs[index])]


def _wait(nodes, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for node in nodes:
            if node.trainer is not None and node.trainer.poll() not in (None, 0):
                raise SystemExit(
                    f"{node.label}: trainer exited {node.trainer.returncode}; see {node.logs[-1]}"
                )
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def step_run(folder: str, label: str, extra: list[str], args) -> dict:
    nodes = [testing.start_node(folder, f"{label}{i}") for i in range(WORLD)]
    testing.launch(
        nodes,
        folder,
        # A job name of its own per run: no run restores what an earlier one left in memory or on disk.
        ["--iterations", str(args.iterations), "--batch", str(args.batch), "--job", label, *extra],
        tag=f"-{label}",
    )
    try:
        for node in nodes:
            node.trainer.wait(args.timeout)
            if node.trainer.returncode:
                raise SystemExit(f"{label}: rank exited {node.trainer.returncode}; see {node.logs[-1]}")
        done = [e for e in _events(nodes) if e["event"] == "done"]
    finally:
        for node in nodes:
            node.kill()
    skip = 3  # the first steps (allocation, the first snapshot's page faults)
    medians = [statistics.median(e["step_seconds"][skip:]) for e in done]
    capture = [c for e in done for c in e.get("capture", [])[1:]]
    replication = [c for e in done for c in e.get("replication", [])[1:]]
    return {
        "label": label,
        "step": statistics.median(medians),
        "per_rank": medians,
        "capture": statistics.median(capture) if capture else None,
        "replication": statistics.median(replication) if replication else None,
        "blocked": sum(e.get("blocked", 0) for e in done) / len(done),
    }


def kill_runs(folder: str, args, chooser: random.Random) -> dict:
    disk = os.path.join(folder, "checkpoints")
    common = [
        "--iterations",
        str(args.iterations),
        "--batch",
        str(args.batch),
        "--every",
        str(args.every_kill),
        "--checkpoint-dir",
        disk,
        "--disk-every",
        str(args.disk_every),
        "--job",
        "bench",
    ]
    nodes = [testing.start_node(folder, f"k{i}") for i in range(WORLD)]
    testing.launch(nodes, folder, common, tag="-k0")
    results = []
    restored = 0
    try:
        for run in range(1, args.kills + 1):
            target = min(
                args.iterations - 2, restored + chooser.randint(args.disk_every // 2 + 1, args.disk_every + 3)
            )
            _wait(
                nodes,
                lambda t=target: (
                    max([e["iteration"] for e in _events(nodes) if e["event"] == "step"] or [0]) >= t
                ),
                args.timeout,
                f"iteration {target}",
            )
            time.sleep(chooser.uniform(0, 0.3))
            victim = chooser.randrange(WORLD)
            nodes[victim].kill()
            for node in nodes:
                node.stop_trainer()
            reached = max(e["iteration"] for e in _events(nodes) if e["event"] == "step")
            on_disk = (
                [
                    int(name[4:16])
                    for name in os.listdir(os.path.join(disk, "bench", "rank0"))
                    if name.endswith(".snap")
                ]
                if os.path.isdir(os.path.join(disk, "bench", "rank0"))
                else []
            )
            checkpoint = max([i for i in on_disk if i <= reached] or [0])
            nodes[victim] = testing.start_node(folder, f"k{victim}-{run}")
            relaunched = time.monotonic()
            testing.launch(nodes, folder, common, tag=f"-k{run}")
            _wait(
                nodes,
                lambda: len([e for e in _events(nodes) if e["event"] == "start"]) == WORLD,
                args.timeout,
                "restore",
            )
            starts = [e for e in _events(nodes) if e["event"] == "start"]
            _wait(
                nodes, lambda: any(e["event"] == "step" for e in _events(nodes)), args.timeout, "first step"
            )
            first_step = time.monotonic() - relaunched
            restored = starts[0]["iteration"]
            results.append(
                {
                    "run": run,
                    "reached": reached,
                    "restored": restored,
                    "kind": starts[0]["kind"],
                    "lost": reached - restored,
                    "lost_disk": reached - checkpoint,
                    "restore_seconds": max(s["seconds"] for s in starts),
                    "relaunch_to_step": first_step,
                }
            )
            print(json.dumps(results[-1]), flush=True)
        # Both nodes of a replica pair: the disk fallback.
        _wait(
            nodes,
            lambda: (
                max([e["iteration"] for e in _events(nodes) if e["event"] == "step"] or [0])
                >= min(args.iterations - 2, restored + args.disk_every + 2)
            ),
            args.timeout,
            "progress",
        )
        nodes[0].kill()
        nodes[1].kill()
        for node in nodes:
            node.stop_trainer()
        reached = max(e["iteration"] for e in _events(nodes) if e["event"] == "step")
        nodes[0], nodes[1] = testing.start_node(folder, "k0-pair"), testing.start_node(folder, "k1-pair")
        testing.launch(nodes, folder, common, tag="-kpair")
        _wait(
            nodes,
            lambda: len([e for e in _events(nodes) if e["event"] == "start"]) == WORLD,
            args.timeout,
            "fallback",
        )
        starts = [e for e in _events(nodes) if e["event"] == "start"]
        fallback = {
            "kind": starts[0]["kind"],
            "reached": reached,
            "restored": starts[0]["iteration"],
            "lost": reached - starts[0]["iteration"],
            "restore_seconds": max(s["seconds"] for s in starts),
        }
        print(json.dumps({"fallback": fallback}), flush=True)
    finally:
        for node in nodes:
            node.kill()
    return {"kills": results, "fallback": fallback}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--batch", type=int, default=2048, help="rows per step per rank (2048: ~0.3 s alone)")
    parser.add_argument("--every", type=int, default=5, help="the 'every N steps' of the step-time table")
    parser.add_argument("--every-kill", type=int, default=1, help="snapshot interval of the kill runs")
    parser.add_argument(
        "--disk-every", type=int, default=10, help="disk checkpoint interval of the kill runs"
    )
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3, help="repeat the step-time table, alternating configs"
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    chooser = random.Random(args.seed)
    configs = [
        ("none", ["--unprotected"]),
        ("every1", ["--every", "1"]),
        (f"every{args.every}", ["--every", str(args.every)]),
    ]
    with tempfile.TemporaryDirectory(prefix="lockstep-protect-bench-") as folder:
        configs.append(
            (
                "every1+disk",
                ["--every", "1", "--checkpoint-dir", os.path.join(folder, "wt"), "--disk-every", "1"],
            )
        )
        runs: dict[str, list[dict]] = {}
        for round_ in range(args.rounds):
            for label, extra in configs:
                result = step_run(folder, f"{label}-{round_}", extra, args)
                runs.setdefault(label, []).append(result)
                print(json.dumps(result), flush=True)
        base = statistics.median(r["step"] for r in runs["none"])
        print(
            "\n| snapshot | median step (s) | overhead | capture (ms) | replication (ms, background) | waited for replication (s/run) |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for label, _ in configs:
            step = statistics.median(r["step"] for r in runs[label])
            capture = [r["capture"] for r in runs[label] if r["capture"] is not None]
            replication = [r["replication"] for r in runs[label] if r["replication"] is not None]
            overhead = "—" if label == "none" else f"{100 * (step / base - 1):+.1f} %"
            capture_ms = f"{1000 * statistics.median(capture):.1f}" if capture else "—"
            replication_ms = f"{1000 * statistics.median(replication):.1f}" if replication else "—"
            blocked = statistics.median(r["blocked"] for r in runs[label])
            print(f"| {label} | {step:.3f} | {overhead} | {capture_ms} | {replication_ms} | {blocked:.2f} |")
        killed = kill_runs(folder, args, chooser)
    kills = killed["kills"]
    print(
        f"\n| kill | reached | restored | lost (snapshot every {args.every_kill}) | lost restarting from the disk "
        f"checkpoint (every {args.disk_every}) | restore (s) | relaunch to first step (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in kills:
        print(
            f"| {k['run']} | {k['reached']} | {k['restored']} ({k['kind']}) | {k['lost']} | {k['lost_disk']} | "
            f"{k['restore_seconds']:.3f} | {k['relaunch_to_step']:.1f} |"
        )
    print(
        f"\nmax lost {max(k['lost'] for k in kills)} vs {max(k['lost_disk'] for k in kills)} from disk; "
        f"mean {statistics.mean(k['lost'] for k in kills):.1f} vs {statistics.mean(k['lost_disk'] for k in kills):.1f}"
    )
    fallback = killed["fallback"]
    print(
        f"both nodes of a pair lost: {fallback['kind']} to iteration {fallback['restored']} "
        f"(reached {fallback['reached']}, lost {fallback['lost']}), restore {fallback['restore_seconds']:.3f} s"
    )


if __name__ == "__main__":
    main()
