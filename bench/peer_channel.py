"""Benchmark: what authenticating the protection runtime's peer channel costs (issue 54).

A 64 MB training state (16 float32 tensors of 4 MB and a small skeleton) is captured into a shared-memory slot,
sealed with the job's snapshot key (HMAC-SHA256 over SHA-256 chunk digests), verified and unpacked, as the runtime
does for every snapshot and every restore; and the holder's requests (register, begin, commit, open, list), each
carrying an HMAC under the job's holder key, are timed against a real holder process. Medians of ``--repeat`` runs.

With ``--baseline FILE`` it also times the snapshot format before this change (a pickled skeleton, no tag), from
that revision's ``state.py``::

    git show 6867613:agent/lockstep_agent/protect/state.py > /tmp/state_before.py
    .venv/bin/python bench/peer_channel.py --baseline /tmp/state_before.py
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "agent"))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "agent"), os.environ.get("PYTHONPATH")]))

import torch  # noqa: E402
from lockstep_agent.protect import state as packing  # noqa: E402
from lockstep_agent.snapshot_holder import HolderClient, make_slot_fd  # noqa: E402


def _state(megabytes: int) -> dict:
    tensors = megabytes // 4
    generator = torch.Generator().manual_seed(0)
    return {
        "iteration": 1,
        "model": {f"layer{i}.weight": torch.randn(1 << 20, generator=generator) for i in range(tensors)},
        "optimizer": {"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": list(range(tensors))}]},
        "stateful.data": {"position": 1234},
    }


def _median_ms(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 2)


def snapshot_format(state: dict, repeat: int) -> dict:
    key = os.urandom(32)
    packed = packing.Packed(state, 1, owner=0, world=2)
    slot = torch.zeros(packed.nbytes, dtype=torch.uint8)
    packed.write_into(slot)
    packing.seal(slot, key)
    return {
        "bytes": packed.nbytes,
        "capture_ms": _median_ms(
            lambda: packing.Packed(state, 1, owner=0, world=2).write_into(slot), repeat
        ),  # the training thread's part
        "seal_ms": _median_ms(lambda: packing.seal(slot, key), repeat),  # the replicator's part
        "verify_ms": _median_ms(lambda: packing.verify(slot, key), repeat),
        "restore_ms": _median_ms(
            lambda: packing.unpack(slot, key, owner=0, world=2), repeat
        ),  # verify + build
    }


def baseline_format(path: str, state: dict, repeat: int) -> dict:
    spec = importlib.util.spec_from_file_location("state_before", path)
    before = importlib.util.module_from_spec(spec)
    sys.modules["state_before"] = before  # its dataclasses and pickles name their module
    spec.loader.exec_module(before)
    packed = before.Packed(state, 1)
    slot = torch.zeros(packed.nbytes, dtype=torch.uint8)
    packed.write_into(slot)
    return {
        "bytes": packed.nbytes,
        "capture_ms": _median_ms(lambda: before.Packed(state, 1).write_into(slot), repeat),
        "restore_ms": _median_ms(lambda: before.unpack(slot), repeat),
    }


def holder_requests(megabytes: int, repeat: int) -> dict:
    folder = tempfile.mkdtemp(prefix="lockstep-bench-holder-")
    path = os.path.join(folder, "holder.sock")
    process = subprocess.Popen(
        [sys.executable, "-m", "lockstep_agent.snapshot_holder", "--socket", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                HolderClient(path, timeout=2).ping()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client = HolderClient(path, job="bench", key=os.urandom(32))
        size = megabytes << 20
        meta = {"owner": 0, "iteration": 1, "nbytes": size, "kind": "own", "world": 2, "node": "n0"}

        def register():
            fd = make_slot_fd("bench/own/0/0", size)
            client.register("own/0/0", fd, size)
            os.close(fd)

        def open_slot():
            fd, _, _ = client.open("own/0/0")
            os.close(fd)

        out = {"register_ms": _median_ms(register, repeat)}
        out["begin_ms"] = _median_ms(lambda: client.begin("own/0/0"), repeat)
        out["commit_ms"] = _median_ms(lambda: client.commit("own/0/0", meta), repeat)
        out["open_ms"] = _median_ms(open_slot, repeat)
        out["list_ms"] = _median_ms(client.list, repeat)
        out["ping_ms"] = _median_ms(client.ping, repeat)
        return out
    finally:
        process.kill()
        process.wait(10)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", help="a state.py of an earlier revision, timed beside this one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = _state(args.megabytes)
    result = {
        "cpus": os.cpu_count(),
        "megabytes": args.megabytes,
        "snapshot": snapshot_format(state, args.repeat),
        "holder": holder_requests(args.megabytes, args.repeat * 3),
    }
    if args.baseline:
        result["baseline"] = baseline_format(args.baseline, state, args.repeat)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
