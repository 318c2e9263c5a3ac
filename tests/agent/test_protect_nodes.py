"""The protection runtime across real processes: three ranks training the test model over gloo, each on a
"node" (a process group of its snapshot holder and its training process) that the tests kill as a unit.

Reports go to a live Lockstep (uvicorn) with the job's token, so what Lockstep records is what happened.
torch is imported inside the tests (``importorskip``): collecting this module never needs it.
"""

import glob
import os
import random
import secrets
import time

import pytest

from jobs.models import JobSnapshot
from tests.support.jobs import protected_cluster, submit
from tests.support.processes import uvicorn_server, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORLD = 3
ITERATIONS = 30


@pytest.fixture
def harness():
    pytest.importorskip("torch")
    from lockstep_agent.protect import testing

    yield testing
    testing.kill_all()  # whatever a failed test left running


@pytest.fixture
def lockstep(tmp_path, tenant_a):
    """A live Lockstep and a job on it; yields (job, env for the training processes)."""
    cluster = protected_cluster(nodes=3, spares=0)
    job = submit(cluster, tenant_a, gpus=24, checkpoint_interval=1000)
    with uvicorn_server(tmp_path) as server:
        yield (
            job,
            dict(
                os.environ,
                LOCKSTEP_URL=server.url,
                LOCKSTEP_JOB_ID=str(job.pk),
                LOCKSTEP_JOB_TOKEN=job.token,
                LOCKSTEP_PROTECT_INTERVAL="0",
                # The job's secret, as a launcher gives it: the same to every rank and every relaunch.
                LOCKSTEP_PROTECT_SECRET=secrets.token_hex(32),
            ),
        )


def _all(nodes, harness, launch_index=-1):
    return [e for node in nodes for e in harness.events(node.logs[launch_index])]


def _wait_steps(nodes, harness, at_least: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            if node.trainer.poll() not in (None, 0):
                raise AssertionError(
                    f"{node.label}'s trainer exited with {node.trainer.returncode}: "
                    + open(node.logs[-1].replace(".jsonl", ".stderr")).read()[-3000:]
                )
        steps = [e["iteration"] for e in _all(nodes, harness) if e["event"] == "step"]
        if steps and max(steps) >= at_least:
            return
        time.sleep(0.05)
    raise TimeoutError(f"iteration {at_least} not reached")


def _finish(nodes, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    for node in nodes:
        node.trainer.wait(max(1, deadline - time.monotonic()))
        assert node.trainer.returncode == 0, open(node.logs[-1].replace(".jsonl", ".stderr")).read()[-3000:]


def _relaunch(nodes, harness, folder, args, env, tag):
    """The job is relaunched: every surviving training process is ended, the holders stay."""
    for node in nodes:
        node.stop_trainer()
    harness.launch(nodes, folder, args, env=env, tag=tag)


def test_a_lost_node_is_restored_from_its_peer_losing_at_most_one_interval(tmp_path, harness, lockstep):
    job, env = lockstep
    folder = str(tmp_path)
    every = 2
    args = [
        "--iterations",
        str(ITERATIONS),
        "--every",
        str(every),
        "--digests",
        "--batch",
        "768",
        "--job",
        str(job.pk),
    ]
    nodes = [harness.start_node(folder, f"node{i}", env) for i in range(WORLD)]
    harness.launch(nodes, folder, args, env=env, tag="-0")
    chooser = random.Random(os.environ.get("PROTECT_TEST_SEED", str(time.time_ns())))
    restored_at, lost, checked = 0, [], 0
    for run in range(1, 6):
        target = min(restored_at + chooser.randint(every + 1, every + 4), ITERATIONS - 2)
        _wait_steps(nodes, harness, target)
        time.sleep(chooser.uniform(0, 0.3))  # anywhere inside an iteration
        victim = chooser.randrange(WORLD)
        nodes[victim].kill()
        for node in nodes:
            node.stop_trainer()
        before = _all(nodes, harness)
        reached = max(e["iteration"] for e in before if e["event"] == "step")
        digests = {
            (e["rank"], e["iteration"]): e["digest"]
            for log in glob.glob(os.path.join(folder, "rank*-*.jsonl"))
            if not log.endswith("-ref.jsonl")
            for e in harness.events(log)
            if e["event"] == "digest"
        }
        nodes[victim] = harness.start_node(folder, f"node{victim}-{run}", env)  # a replacement node, empty
        harness.launch(nodes, folder, args, env=env, tag=f"-{run}")
        wait_for(
            lambda: len([e for e in _all(nodes, harness) if e["event"] == "start"]) == WORLD,
            120,
            what="every rank restored",
        )
        starts = sorted((e for e in _all(nodes, harness) if e["event"] == "start"), key=lambda e: e["rank"])
        assert {s["kind"] for s in starts} == {"snapshot"}, starts
        assert len({s["iteration"] for s in starts}) == 1
        restored_at = starts[0]["iteration"]
        lost.append(max(0, reached - restored_at))
        # At most one snapshot interval lost (the newest snapshot may be a hair newer than the last logged step).
        assert -1 <= reached - restored_at <= every, (run, reached, restored_at)
        # The lost rank came back from its replica on the next node; the others from their own copies.
        peer = nodes[(victim + 1) % WORLD].label
        assert starts[victim]["sources"][str(victim)] == f"replica on {peer}"
        assert all(starts[r]["sources"][str(r)].startswith("own copy") for r in range(WORLD) if r != victim)
        # Bit-identical: each rank's restored state is the state it had at that snapshot.
        # (A rank killed between its snapshot and its digest line has none to compare: the others do, and the
        # final model equal to the uninterrupted run's covers it.)
        compared = [s for s in starts if (s["rank"], restored_at) in digests]
        assert len(compared) >= WORLD - 1, (run, restored_at, sorted(digests))
        for start in compared:
            assert start["digest"] == digests[(start["rank"], restored_at)], (run, start["rank"])
        checked += len(compared)
    # The reference, beside the last stretch: the same training, unprotected and never interrupted.
    reference_nodes = [harness.start_node(folder, f"ref{i}", env) for i in range(WORLD)]
    harness.launch(reference_nodes, folder, [*args, "--unprotected"], env=env, tag="-ref")
    _finish(nodes)
    _finish(reference_nodes)
    final = {e["digest"] for e in _all(nodes, harness) if e["event"] == "done"}
    reference = {e["digest"] for e in _all(reference_nodes, harness) if e["event"] == "done"}
    for node in nodes + reference_nodes:
        node.kill()
    assert len(reference) == 1
    print(
        f"\nfive kills: iterations lost {lost} (snapshot every {every}); max {max(lost)}; {checked} restored states bit-identical"
    )
    assert final == reference  # five losses later, the same model as training without any
    # Lockstep saw the restore points and each restore, with measured seconds.
    rows = JobSnapshot.objects.filter(job=job)
    assert rows.filter(kind="restore").count() == 5
    assert rows.filter(kind="snapshot", state="succeeded").count() >= ITERATIONS // every
    assert all(
        r.seconds is not None and r.seconds < 30 and r.size_bytes > 3 * 4_988_928
        for r in rows.filter(kind="restore")
    )


def test_losing_both_nodes_of_a_replica_pair_falls_back_to_the_disk_checkpoint_and_says_so(
    tmp_path, harness, lockstep
):
    job, env = lockstep
    folder = str(tmp_path)
    args = [
        "--iterations",
        "16",
        "--every",
        "1",
        "--batch",
        "512",
        "--job",
        str(job.pk),
        "--checkpoint-dir",
        os.path.join(folder, "checkpoints"),
        "--disk-every",
        "4",
    ]
    nodes = [harness.start_node(folder, f"node{i}", env) for i in range(WORLD)]
    harness.launch(nodes, folder, args, env=env, tag="-0")
    _wait_steps(nodes, harness, 10)
    nodes[1].kill()  # rank 1's own copy
    nodes[2].kill()  # and the replica of it, kept by the next node
    for node in nodes:
        node.stop_trainer()
    reached = max(e["iteration"] for e in _all(nodes, harness) if e["event"] == "step")
    nodes[1], nodes[2] = (
        harness.start_node(folder, "node1-new", env),
        harness.start_node(folder, "node2-new", env),
    )
    harness.launch(nodes, folder, args, env=env, tag="-1")
    _finish(nodes)
    starts = [e for e in _all(nodes, harness) if e["event"] == "start"]
    for node in nodes:
        node.kill()
    assert {s["kind"] for s in starts} == {"disk_fallback"}, starts
    iteration = starts[0]["iteration"]
    assert (
        {s["iteration"] for s in starts} == {iteration}
        and iteration % 4 == 0
        and reached - 5 <= iteration <= reached
    )
    assert "rank(s) 1 " in starts[0]["reason"] and "gone" in starts[0]["reason"]
    fallback = JobSnapshot.objects.get(job=job, kind="disk_fallback")
    assert fallback.iteration == iteration and fallback.state == "recorded" and "rank(s) 1 " in fallback.note


def test_a_stalled_rank_is_reported_as_a_hang_naming_it(tmp_path, harness, lockstep):
    job, env = lockstep
    folder = str(tmp_path)
    args = [
        "--iterations",
        "12",
        "--every",
        "1",
        "--batch",
        "512",
        "--job",
        str(job.pk),
        "--ddp",
        "--stall-rank",
        "1",
        "--stall-at",
        "7",
        "--stall-seconds",
        "60",
        "--hang-factor",
        "4",
        "--hang-min-seconds",
        "2",
    ]
    nodes = [harness.start_node(folder, f"node{i}", env) for i in range(WORLD)]
    harness.launch(nodes, folder, args, env=env, tag="-0")
    try:
        wait_for(
            lambda: {e["rank"] for e in _all(nodes, harness) if e["event"] == "hang"} == {0, 1, 2},
            120,
            what="a hang report on every rank",
        )
        hangs = [e for e in _all(nodes, harness) if e["event"] == "hang"]
        assert all(h["stalled_ranks"] == [1] and h["iteration"] == 6 for h in hangs), hangs
        assert all(h["seconds"] >= max(2, 4 * h["usual_seconds"]) for h in hangs)
        wait_for(
            lambda: JobSnapshot.objects.filter(job=job, kind="hang").exists(), 20, what="the hang in Lockstep"
        )
        reported = JobSnapshot.objects.get(
            job=job, kind="hang"
        )  # one report, from the lowest rank still waiting
        assert reported.stalled_ranks == [1] and reported.iteration == 6 and "rank(s) 1 " in reported.note
        assert reported.locations == [{"rank": 1, "node": "node1"}]
    finally:
        for node in nodes:
            node.kill()
