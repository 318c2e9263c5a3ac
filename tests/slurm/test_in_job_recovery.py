"""In-job recovery on a real Slurm: the real PyTorch job with standbys in its allocation, a node killed under an
active rank (its slurmd, its rank, its snapshot holder); the survivors keep their processes and a standby takes the
lost rank's place, restored from its peer's memory (lockstep_agent/protect/membership.py) — or, where that cannot
be, the job falls back to the requeue path and says why.

No Lockstep here: the runtime must work without one. Its reports go to a stand-in for the snapshot endpoint
(``ReportSink``), and the job writes down what it did (its generations, its pids, a digest of its parameters after
every step), which is compared with an uninterrupted run of the same job.
"""

import pytest

pytestmark = pytest.mark.slow

STEPS = 100_000  # the job trains until the test cancels it


@pytest.fixture
def in_job_slurm(tmp_path):
    """Starts a test Slurm of ``nodes`` nodes (the last ``spare_nodes`` also the partition ``spare``) with a
    snapshot holder on each (``in_job_slurm(3)``); stopped after the test."""
    from contextlib import ExitStack

    from jobs.local_slurm.cluster import SlurmCluster, available

    why = available()
    if why:
        pytest.skip(why)
    with ExitStack() as stack:

        def start(nodes: int, spare_nodes: int = 0) -> SlurmCluster:
            cluster = SlurmCluster(tmp_path / "slurm", nodes=nodes, spare_nodes=spare_nodes, holders=True)
            return stack.enter_context(cluster)

        yield start


def _started(folder, standbys: int, steps: int):
    """Wait until the job trained ``steps`` steps and its standbys wait in the job's store."""
    from jobs.local_slurm.training import checksums
    from tests.support.in_job import until

    ranks = folder / "ckpt" / "ranks" / "0"
    until(
        lambda: len(list(ranks.glob("standby-*.json"))) == standbys and len(checksums(folder)) >= steps,
        120,
        f"{steps} steps and {standbys} standby(s) waiting",
    )


def _replaced(folder, generation: int, steps: int = 5) -> dict:
    """Rank 0's rank_replaced report of ``generation``, once it trained ``steps`` steps in it."""
    from jobs.local_slurm.training import checksums, in_job_events
    from tests.support.in_job import until

    def done():
        found = [e for e in in_job_events(folder) if e.get("generation") == generation]
        replaced = [e for e in found if e["kind"] == "rank_replaced"]
        after = [c for c in checksums(folder) if c["generation"] == generation]
        return replaced[0] if replaced and len(after) >= steps else None

    return until(done, 90, f"a standby trained in generation {generation}")


def _same_as_uninterrupted(folder, tmp_path, world: int = 2) -> list[dict]:
    """Every digest the job wrote (redone steps too) equals an uninterrupted run's at that step."""
    from jobs.local_slurm.training import checksums
    from tests.support.in_job import reference_checksums

    written = checksums(folder)
    (tmp_path / "reference").mkdir()
    reference = reference_checksums(tmp_path / "reference", max(c["step"] for c in written), world)
    wrong = [c for c in written if reference[c["step"]] != c["sha256"]]
    assert not wrong, wrong[:3]
    return written


def test_a_lost_rank_is_replaced_by_a_standby_and_the_survivor_keeps_its_process(in_job_slurm, tmp_path):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    import json

    from jobs.local_slurm.training import in_job_events, kill_member, submit_in_job_training
    from tests.support.in_job import ReportSink

    slurm, folder = in_job_slurm(3), tmp_path / "run"
    with ReportSink() as sink:
        job = submit_in_job_training(slurm, folder, active=2, standbys=1, steps=STEPS, env=sink.env)
        _started(folder, standbys=1, steps=12)
        killed_at, node = kill_member(slurm, folder, 1)
        replaced = _replaced(folder, 1)
        slurm.run("scancel", job)
    ranks = folder / "ckpt" / "ranks" / "0"
    first = json.loads((ranks / "0.json").read_text())
    survivor, standby = (json.loads((ranks / f"gen1-rank{r}.json").read_text()) for r in (0, 1))

    # The survivor is the same process; the standby (member 2, on n3) is rank 1 now; nothing was relaunched.
    assert node == "n2" and survivor["pid"] == first["pid"] and survivor["member"] == 0
    assert standby["member"] == 2 and standby["node"] == "n3"
    assert not (folder / "ckpt" / "ranks" / "1").exists()
    lost = in_job_events(folder)[0]
    assert lost["kind"] == "peer_lost" and lost["lost_ranks"] == [1] and lost["lost_nodes"] == ["n2"]
    assert lost["generation"] == 0 and lost["at"] >= killed_at - 0.5
    assert (
        replaced["from_nodes"] == ["n2"]
        and replaced["to_nodes"] == ["n3"]
        and replaced["standbys_left"] == []
    )
    assert replaced["survivor_pids"] == {"0": first["pid"]} and replaced["lost_iterations"] <= 1
    assert replaced["bytes"] > 0 and 0 < replaced["seconds"] < 60

    # What the runtime sent (without being asked twice): both reports, and the standbys in its restore points.
    assert [b["kind"] for b in sink.bodies if b["kind"] in ("peer_lost", "rank_replaced")] == [
        "peer_lost",
        "rank_replaced",
    ]
    assert {k: v for k, v in sink.of("rank_replaced")[0].items() if k not in ("received", "path")} == replaced
    points = sink.of("snapshot")
    before = [p for p in points if p["received"] < killed_at]
    assert before and before[-1]["standbys"] == ["n3"] and before[-1]["active_nodes"] == ["n1", "n2"]
    assert points[-1]["standbys"] == [] and points[-1]["active_nodes"] == ["n1", "n3"]
    assert sink.of("restore") == []

    # Resumed from the state an uninterrupted run had at that iteration, and went on with the same bits.
    written = _same_as_uninterrupted(folder, tmp_path)
    again = min(c["at"] for c in written if c["generation"] == 1)
    print(
        f"in-job: node killed → training again {again - killed_at:.1f} s; iterations lost "
        f"{replaced['lost_iterations']}; survivors restarted: no"
    )


def _fell_back(slurm, folder, job: str, sink, kind: str, member: int = 0, lost=None) -> tuple[dict, dict]:
    """Wait for the runtime (``member``'s event) to give up in place, do Lockstep's part (drain the dead nodes —
    ``lost``, else those its peer_lost named — and requeue the job) and wait for the relaunch's ``kind`` report
    and 5 steps after it: the fallback event and that report."""
    from jobs.local_slurm.training import checksums, in_job_events
    from tests.support.in_job import until

    fallback = until(
        lambda: next((e for e in in_job_events(folder, member=member) if e["kind"] == "fallback"), None),
        60,
        "the fallback",
    )
    for name in lost or fallback_nodes(folder):
        slurm.run("scontrol", "update", f"nodename={name}", "state=drain", "reason=in-job-test")
    slurm.run("scontrol", "requeue", job)
    report = until(lambda: next(iter(sink.of(kind)), None), 180, f"the relaunch's {kind} report")
    until(
        lambda: len([c for c in checksums(folder) if c["at"] > report["received"]]) >= 5, 60, "training again"
    )
    return fallback, report


def fallback_nodes(folder) -> list[str]:
    from jobs.local_slurm.training import in_job_events

    return next(e for e in in_job_events(folder) if e["kind"] == "peer_lost")["lost_nodes"]


def test_without_a_standby_the_job_falls_back_to_a_relaunch_and_says_why(in_job_slurm, tmp_path):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    import json

    from jobs.local_slurm.training import kill_member, submit_in_job_training
    from tests.support.in_job import ReportSink

    slurm, folder = in_job_slurm(3), tmp_path / "run"  # n1 + n2 train; n3 is free for the relaunch
    with ReportSink() as sink:
        job = submit_in_job_training(slurm, folder, active=2, standbys=0, steps=STEPS, env=sink.env)
        _started(folder, standbys=0, steps=12)
        kill_member(slurm, folder, 1)
        fallback, restore = _fell_back(slurm, folder, job, sink, "restore")
        slurm.run("scancel", job)

    assert fallback["reason"].startswith("no standby left for rank(s) 1"), fallback
    assert sink.of("peer_lost")[0]["lost_nodes"] == ["n2"] and sink.of("rank_replaced") == []
    # The relaunch restored from memory (rank 1 from its replica on n1) and said why it had to relaunch.
    assert restore["reason"] == f"in-place replacement impossible: {fallback['reason']}", restore
    assert {"rank": 1, "source": "replica on n1"} in restore["locations"], restore["locations"]
    after = [json.loads(p.read_text()) for p in sorted((folder / "ckpt" / "ranks" / "1").glob("[0-9].json"))]
    assert sorted(r["node"] for r in after) == ["n1", "n3"]
    _same_as_uninterrupted(folder, tmp_path)


def test_a_second_node_loss_right_after_the_first_takes_the_second_standby(in_job_slurm, tmp_path):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    import json

    from jobs.local_slurm.training import kill_member, submit_in_job_training

    slurm, folder = in_job_slurm(4), tmp_path / "run"
    job = submit_in_job_training(slurm, folder, active=2, standbys=2, steps=STEPS)
    _started(folder, standbys=2, steps=12)
    kill_member(slurm, folder, 1)
    first = _replaced(folder, 1, steps=0)
    killed_at, node = kill_member(slurm, folder, 2)  # the standby that just took rank 1
    second = _replaced(folder, 2)
    slurm.run("scancel", job)

    assert first["to_nodes"] == ["n3"] and first["standbys_left"] == ["n4"]
    assert node == "n3" and second["from_nodes"] == ["n3"] and second["to_nodes"] == ["n4"]
    assert second["standbys_left"] == [] and second["lost_iterations"] <= 1
    ranks = folder / "ckpt" / "ranks" / "0"
    pid = json.loads((ranks / "0.json").read_text())["pid"]
    assert first["survivor_pids"] == second["survivor_pids"] == {"0": pid}
    assert json.loads((ranks / "gen2-rank1.json").read_text())["member"] == 3
    written = _same_as_uninterrupted(folder, tmp_path)
    again = min(c["at"] for c in written if c["generation"] == 2)
    print(f"in-job, second loss: node killed → training again {again - killed_at:.1f} s")


def test_both_copies_of_a_rank_lost_fall_back_to_the_disk(in_job_slurm, tmp_path):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    import json

    from jobs.local_slurm.training import checksums, kill_member, submit_in_job_training
    from tests.support.in_job import ReportSink

    # Three ranks in a ring: rank 1's replica is on rank 2's node; both die at once. n4 + n5 for the relaunch.
    slurm, folder = in_job_slurm(5), tmp_path / "run"
    with ReportSink() as sink:
        job = submit_in_job_training(slurm, folder, active=3, standbys=0, steps=STEPS, env=sink.env)
        _started(folder, standbys=0, steps=24)  # past the first disk checkpoint (every 20 steps)
        kill_member(slurm, folder, 2)
        kill_member(slurm, folder, 1)
        fallback, restored = _fell_back(slurm, folder, job, sink, "disk_fallback")
        slurm.run("scancel", job)

    assert fallback["reason"].startswith("both copies of rank 1 lost"), fallback
    assert restored["reason"] == f"in-place replacement impossible: {fallback['reason']}", restored
    assert restored["iteration"] % 20 == 0 and restored["iteration"] >= 20
    # The relaunch resumed from the very state the job had at that iteration. (Past it, three ranks' gradient sums
    # in a relaunched job differ in the last bits from a run never relaunched, disk checkpoint or not: measured
    # with the plain job, so the digests after the relaunch are not compared.)
    resumed = json.loads((folder / "ckpt" / "ranks" / "1" / "resumed.json").read_text())
    before = {c["step"]: c["sha256"] for c in checksums(folder) if c["at"] < restored["received"]}
    assert resumed["step"] == restored["iteration"] and resumed["sha256"] == before[resumed["step"]]


def test_a_used_standby_is_replenished_by_a_standby_job_on_the_spare_partition(in_job_slurm, tmp_path):
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")
    import json

    from jobs.local_slurm.training import kill_member, submit_in_job_training, submit_standby
    from tests.support.in_job import ReportSink, until

    slurm, folder = in_job_slurm(4, spare_nodes=1), tmp_path / "run"  # the job on n1-n3; n4 is the spare
    with ReportSink() as sink:
        job = submit_in_job_training(slurm, folder, active=2, standbys=1, steps=STEPS, env=sink.env)
        _started(folder, standbys=1, steps=12)
        kill_member(slurm, folder, 1)
        first = _replaced(folder, 1, steps=0)
        standby_job = submit_standby(slurm, job, node="n4")
        until(
            lambda: any(
                p.get("standbys") == ["n4"] for p in sink.of("snapshot") if p["received"] > first["at"]
            ),
            90,
            "rank 0 to count the new standby on n4",
        )
        killed_at, node = kill_member(slurm, folder, 2)  # the standby that took rank 1 on n3
        second = _replaced(folder, 2)
        slurm.run("scancel", job, standby_job)

    assert first["standbys_left"] == [] and node == "n3"
    assert second["to_nodes"] == ["n4"] and second["standbys_left"] == [] and second["lost_iterations"] <= 1
    ranks = folder / "ckpt" / "ranks" / "0"
    newcomer = json.loads((ranks / "gen2-rank1.json").read_text())
    assert newcomer["member"] == 3 and newcomer["node"] == "n4"
    pid = json.loads((ranks / "0.json").read_text())["pid"]
    assert second["survivor_pids"] == {"0": pid}
    written = _same_as_uninterrupted(folder, tmp_path)
    again = min(c["at"] for c in written if c["generation"] == 2)
    print(f"in-job, replenished standby: node killed → training again {again - killed_at:.1f} s")


def test_the_store_hosts_loss_falls_back_to_a_relaunch_restored_from_memory(in_job_slurm, tmp_path):
    """Rank 0's node hosts the job's store: with it gone nobody can re-form the group in place. The survivor says
    so and exits; the relaunch (on n2, the standby's n3 and n4) restores rank 0 from its replica on n2."""
    pytest.importorskip("torch", reason="the training job needs torch (CPU wheel)")

    from jobs.local_slurm.training import kill_member, submit_in_job_training
    from tests.support.in_job import ReportSink

    slurm, folder = in_job_slurm(4), tmp_path / "run"  # n1 + n2 train, n3 waits; n4 free for the relaunch
    with ReportSink() as sink:
        job = submit_in_job_training(slurm, folder, active=2, standbys=1, steps=STEPS, env=sink.env)
        _started(folder, standbys=1, steps=12)
        _, node = kill_member(slurm, folder, 0)
        fallback, restore = _fell_back(slurm, folder, job, sink, "restore", member=1, lost=[node])
        slurm.run("scancel", job)

    assert node == "n1" and fallback["reason"].startswith("store host lost"), fallback
    assert sink.of("rank_replaced") == []
    assert restore["reason"] == f"in-place replacement impossible: {fallback['reason']}", restore
    # Both ranks from memory kept on n2, the survivor's node (rank 0's own copy died with n1): no disk.
    assert sorted(place["rank"] for place in restore["locations"]) == [0, 1], restore["locations"]
    assert all(place["source"].endswith(" on n2") for place in restore["locations"]), restore["locations"]
    _same_as_uninterrupted(folder, tmp_path)
