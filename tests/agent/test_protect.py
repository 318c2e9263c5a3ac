"""The protection runtime in one process: packing is bit-identical, the holder keeps slots past their writer,
and the package fails plainly without torch. The multi-process tests are in test_protect_nodes.py; the peer
channel's defences (who may use a holder, sizes, planted slots, forged heartbeats) in test_protect_peer_channel.py."""

import os
import subprocess
import sys
import textwrap

import pytest


def test_packed_state_comes_back_bit_identical_model_optimizer_and_rng():
    torch = pytest.importorskip("torch")
    from lockstep_agent.protect import state as packing
    from lockstep_agent.protect.testing import SyntheticData, TestModel

    torch.manual_seed(3)
    model = TestModel()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = SyntheticData(0, 32)
    for _ in range(2):
        x, y = data.next()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    captured = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": data.state_dict(),
        "rng": packing.rng_state(),
        "iteration": 2,
        "odd": [torch.tensor(True), (torch.zeros(0), 1.5)],
    }
    key, other_key = b"k" * 32, b"o" * 32
    packed = packing.Packed(captured, 2, owner=1, world=3)
    buffer = torch.zeros(packed.nbytes + 100, dtype=torch.uint8)
    packed.write_into(buffer)
    packing.seal(buffer, key)
    iteration, back = packing.unpack(buffer, key, owner=1, world=3)
    assert iteration == 2 and packing.digest(back) == packing.digest(captured)
    assert (
        isinstance(back["odd"][1], tuple)
        and back["rng"]["numpy"][1].dtype == captured["rng"]["numpy"][1].dtype
    )
    for name, tensor in captured["model"].items():
        assert back["model"][name].dtype == tensor.dtype and torch.equal(back["model"][name], tensor)
    # The restored RNG draws what the captured one would have.
    expected = torch.rand(5)
    packing.set_rng_state(back["rng"])
    assert torch.equal(torch.rand(5), expected)
    # One flipped bit is a different digest: the digest can fail.
    back["model"]["layers.0.weight"].view(-1).view(torch.int32)[7] ^= 1
    assert packing.digest(back) != packing.digest(captured)
    # Only the job's key, the owner's and the world's: anything else is refused before its skeleton is read.
    with pytest.raises(packing.SnapshotRefused, match="tag is wrong"):
        packing.unpack(buffer, other_key)
    with pytest.raises(packing.SnapshotRefused, match="rank 1's state, not rank 0's"):
        packing.unpack(buffer, key, owner=0)
    with pytest.raises(packing.SnapshotRefused, match="world of 3"):
        packing.unpack(buffer, key, world=2)
    tampered = buffer.clone()
    tampered[packed.nbytes - 1] ^= 1  # one bit of the last tensor
    with pytest.raises(packing.SnapshotRefused, match="tag is wrong"):
        packing.unpack(tampered, key)
    with pytest.raises(packing.SnapshotRefused, match="truncated"):
        packing.unpack(buffer[: packed.nbytes - 1], key)
    with pytest.raises(ValueError):
        packing.unpack(bytearray(200), key)
    # What it cannot hold it refuses to capture, saying where.
    with pytest.raises(TypeError, match=r"state\['data'\]\['sampler'\]: a object"):
        packing.Packed({"data": {"sampler": object()}}, 1)


def test_holder_keeps_a_slot_after_its_writer_is_gone_and_only_committed_slots_count(tmp_path):
    pytest.importorskip("torch")  # the launcher lives with the test model
    from lockstep_agent.protect.testing import start_node
    from lockstep_agent.snapshot_holder import HolderClient, make_slot_fd

    node = start_node(str(tmp_path), "n0")
    key = os.urandom(32)
    try:
        writer = textwrap.dedent(f"""
            import mmap, os
            from lockstep_agent.snapshot_holder import HolderClient, make_slot_fd
            client = HolderClient({node.socket_path!r}, job="job", key=bytes.fromhex({key.hex()!r}))
            fd = make_slot_fd("job/own/0/0", 4096)
            client.register("own/0/0", fd, 4096)
            m = mmap.mmap(fd, 4096); m[:5] = b"hello"
            client.commit("own/0/0", {{"iteration": 4, "owner": 0}})
            fd2 = make_slot_fd("job/own/0/1", 4096)
            client.register("own/0/1", fd2, 4096)   # begun, never committed
        """)
        subprocess.run([sys.executable, "-c", writer], check=True, timeout=30)  # the writer exits
        client = HolderClient(node.socket_path, job="job", key=key)
        listed = {s["name"]: s["meta"] for s in client.list()}
        assert listed == {"own/0/0": {"iteration": 4, "owner": 0}, "own/0/1": None}
        fd, size, meta = client.open("own/0/0")
        assert os.pread(fd, 5, 0) == b"hello" and size == 4096 and meta["iteration"] == 4
        os.close(fd)
        assert client.drop(above=3) == 2 and client.list() == []
        with pytest.raises(RuntimeError, match="no slot"):
            client.commit("own/0/0", {})
        client.register("own/0/0", make_slot_fd("x", 10), 10)
        assert client.stats()["slots"] == 1 and client.stats()["bytes"] == 10
    finally:
        node.kill()
    assert node.holder.returncode == -9  # SIGKILLed with its node: the kernel frees the slots


def test_the_runtime_needs_torch_and_says_so_while_its_tests_import_without_it(tmp_path):
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['torch'] = None\n")  # `import torch` now raises ImportError
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    failed = subprocess.run(
        [sys.executable, "-c", "import lockstep_agent.protect"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert failed.returncode != 0 and "torch" in failed.stderr
    # The holder does not need it, and collecting the runtime's tests never fails without it.
    holder = subprocess.run(
        [sys.executable, "-c", "import lockstep_agent.snapshot_holder"], env=env, timeout=60
    )
    assert holder.returncode == 0
    here = os.path.dirname(__file__)
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            os.path.join(here, "test_protect.py"),
            os.path.join(here, "test_protect_nodes.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(here)),
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert "test_protect_nodes.py::" in collected.stdout


def test_one_process_restores_from_its_holder_and_writes_through_to_disk(tmp_path):
    torch = pytest.importorskip("torch")
    from lockstep_agent.protect import Protection
    from lockstep_agent.protect import state as packing
    from lockstep_agent.protect.testing import SyntheticData, TestModel, start_node

    def train(protect, model, optimizer, data, upto):
        digests = {}
        for iteration in range(protect.start_iteration + 1, upto + 1):
            x, y = data.next()
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            protect.step(iteration)
            digests[iteration] = packing.digest(protect.state_dict(iteration))
        protect.wait(30)
        return digests

    def fresh():
        torch.manual_seed(0)
        model = TestModel()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), SyntheticData(0, 16)

    node = start_node(str(tmp_path), "solo")
    try:
        model, optimizer, data = fresh()
        first = Protection(
            model,
            optimizer,
            every=2,
            stateful={"data": data},
            holder=node.socket_path,
            checkpoint_dir=str(tmp_path / "disk"),
            job="solo",
        )
        assert first.restored.kind == "fresh" and first.start_iteration == 0
        at_four = train(first, model, optimizer, data, 5)[4]
        path = first.write_through()  # before a planned drain: the newest snapshot (4) on disk, now
        assert path.endswith("iter000000000004.snap") and os.path.getsize(path) > 3 * 4_988_928
        first.close()
        # What snapshots cost the training thread: every capture, every wait for a round, the write-through.
        in_thread = sum(first.capture_seconds) + first.blocked_seconds
        assert first.overhead_seconds > in_thread > 0
        # A relaunch on the same node: restored from the holder's shared memory, bit for bit.
        model, optimizer, data = fresh()
        second = Protection(
            model,
            optimizer,
            every=2,
            stateful={"data": data},
            holder=node.socket_path,
            checkpoint_dir=str(tmp_path / "disk"),
            job="solo",
        )
        assert (second.restored.kind, second.start_iteration) == ("snapshot", 4)
        assert second.restored.sources == {0: "own copy on " + second.node}
        assert packing.digest(second.state_dict(4)) == at_four and data.position == 4
        second.close()
    finally:
        node.kill()
    # The node is gone with its memory: the disk copy written through is what is left.
    node = start_node(str(tmp_path), "solo-new")
    try:
        model, optimizer, data = fresh()
        third = Protection(
            model,
            optimizer,
            every=2,
            stateful={"data": data},
            holder=node.socket_path,
            checkpoint_dir=str(tmp_path / "disk"),
            job="solo",
        )
        assert (third.restored.kind, third.start_iteration) == ("disk_fallback", 4)
        assert packing.digest(third.state_dict(4)) == at_four
        third.close()
    finally:
        node.kill()
