"""The what-if's real-path replay: the sampled interruptions through Lockstep's own services, in a scratch store.

Each replay runs in a process of its own on ``simulator.replay_settings`` (an in-memory SQLite database, an in-process
channel layer and cache, Celery eager), as ``manage.py simulate what-if --real-path`` runs it.
"""

from dataclasses import replace

import pytest

from fleet.models import Cluster, Node
from jobs.models import Job, RecoveryAction
from simulator.replay import NotScratch, replay_real_path, run_in_scratch, run_in_scratch_many
from simulator.replay_sensitivity import RECOSTED, real_path_runs, recost
from simulator.sampling import Strike
from simulator.whatif import WhatIfConfig

pytestmark = pytest.mark.slow  # each replay runs in a process of its own

# 2,048 GPUs for 54 days: about 50 interruptions, about 10 s through the real path; 12 spares, so that a whole rack
# failing (8 nodes) finds enough (with the default 2 %, 5 spares, it fails the job: see the rack test below)
SMALL = WhatIfConfig(seed=3, gpus=2048, days=54.0, spare_fraction=0.05)


@pytest.fixture(scope="module")
def replayed():
    return run_in_scratch(SMALL, timeout=300)


def test_it_refuses_to_run_on_the_live_database():
    with pytest.raises(NotScratch):
        replay_real_path(SMALL)


@pytest.mark.django_db
def test_every_interruption_goes_through_the_services_and_every_recovery_ends(replayed):
    assert replayed["interruptions"] >= 10
    assert replayed["replayed"] == replayed["interruptions"] - replayed["struck_while_job_held_no_nodes"]
    # each recovery ended, or waited for a repaired spare and went on when one came: none is left at the end
    assert set(replayed["recoveries"]) <= {"ended", "waiting"}, replayed["recoveries"]
    assert sum(replayed["recoveries"].values()) == replayed["replayed"]
    assert replayed["recoveries_open_at_end"] == 0
    actions = replayed["actions"]
    # the decision's own choices: dead nodes migrated off (the ladder cordons and drains them), others restarted
    assert (
        actions["live_migration"] >= 1 and actions["cordon"] == actions["drain"] >= actions["live_migration"]
    )
    assert actions.get("restart_from_checkpoint", 0) >= 1
    # the replay's operator repaired the failed nodes, and the ladder returned them to the spare pool
    assert replayed["nodes_repaired"] >= 1 and replayed["job_state"] == "Running"
    # the fault model's precursors went through the risk sweep: predictions, proactive moves, judged at the strike
    assert replayed["precursors_shown"] >= 1 and replayed["predictions"] >= 1
    assert replayed["predictions_came_true"] >= 1 and actions.get("proactive_migration", 0) >= 1
    assert replayed["predictions_open"] == 0
    assert 0 < replayed["gpu_hours_lost"] < replayed["gpu_hours_baseline"]
    assert 0.5 < replayed["effective_training_time"] < 1.0
    # the scratch store is a database of its own: nothing of the replay is in the suite's
    assert not Job.objects.filter(name="training-run").exists()
    assert not Cluster.objects.filter(name="what-if").exists()
    assert not Node.objects.exists() and not RecoveryAction.objects.exists()


def test_the_same_seed_replays_the_same_decisions(replayed):
    again = run_in_scratch(SMALL, timeout=300)
    for key in ("actions", "recoveries", "nodes_repaired", "gpu_hours_lost", "effective_training_time"):
        assert again[key] == replayed[key], key


def test_the_spares_run_out_when_repairs_are_slow_and_the_job_pays_for_it(replayed):
    # one spare for 128 nodes, repaired in a month: the spare is used up, the next restart finds no healthy spare
    # node for the dead one's ranks, and the job fails (the product gives up after its attempts)
    scarce = run_in_scratch(replace(SMALL, gpus=1024, spare_fraction=0.005, repair_hours=720.0), timeout=300)
    assert scarce["job_state"] == "Failed" and scarce["struck_while_job_held_no_nodes"] > 0, scarce
    assert scarce["effective_training_time"] < replayed["effective_training_time"] - 0.2


def _rack_strike(config):
    # a power supply on node 12 of 32 (3 spares): with rack_failure_share 1 it takes the node's rack, nodes 8-15
    strikes = [Strike(1.0, "Power Supply", "node_unreachable", None, "", "", 100)]
    return run_in_scratch(config, strikes=strikes, timeout=300)


def test_a_rack_failure_uses_up_the_spares_and_the_job_waits_for_repairs(monkeypatch):
    config = WhatIfConfig(
        seed=5, gpus=256, days=1.0, spare_fraction=0.1, failed_recovery_share=0.0, repair_hours=2.0
    )
    one = _rack_strike(replace(config, rack_failure_share=0.0))
    rack = _rack_strike(replace(config, rack_failure_share=1.0))

    # one node down: a spare takes its ranks and the job runs on
    assert one["correlated"] == {} and [d["kind"] for d in one["decisions"]] == ["node_unreachable"]
    assert ("live_migration", "succeeded") in map(tuple, one["decisions"][0]["actions"])
    assert one["job_state"] == "Running"
    # its rack: eight nodes at once and three spares. The restart finds no healthy spare for every dead node and
    # waits, parked; the operator repairs the rack's nodes, a node returned wakes it, and the job runs on, having
    # paid for the wait
    assert rack["correlated"] == {"rack": 1}
    # The ladder drains each dead node; each drain raises a drain request (issue 47), which moves nothing here:
    # the job's restart already owns its ranks (one incident, one recovery).
    faults = [d for d in rack["decisions"] if d["kind"] != "drain"]
    drains = [d for d in rack["decisions"] if d["kind"] == "drain"]
    assert [d["kind"] for d in faults] == ["node_unreachable"] * 8
    assert len(drains) <= 8 and all(d["actions"] == [] for d in drains), drains
    restarts = [
        state for d in rack["decisions"] for kind, state in d["actions"] if kind == "restart_from_checkpoint"
    ]
    assert "succeeded" in restarts, rack["decisions"]
    assert rack["job_state"] == "Running" and rack["nodes_repaired"] >= 5
    assert rack["recovering_hours"] > one["recovering_hours"] + 0.25, (rack, one)
    assert rack["effective_training_time"] < one["effective_training_time"] - 0.01

    # without the wait (RECOVERY_SPARE_WAIT_SECONDS=0, as before issue 20's finding) the job fails instead
    monkeypatch.setenv("RECOVERY_SPARE_WAIT_SECONDS", "0")
    failed = _rack_strike(replace(config, rack_failure_share=1.0))
    restarts = [
        state
        for d in failed["decisions"]
        for kind, state in d["actions"]
        if kind == "restart_from_checkpoint"
    ]
    assert restarts and set(restarts) == {"failed"}, failed["decisions"]
    assert failed["job_state"] == "Failed"
    assert failed["effective_training_time"] < rack["effective_training_time"] - 0.5


def _one_strike(component, kind, xid, precursor):
    # GPU 100 (node 12 of 32) at hour 20, in a day: its precursor, if any, shows 14 h before (hour 6)
    config = WhatIfConfig(seed=5, gpus=256, days=1.0, spare_fraction=0.1, failed_recovery_share=0.0)
    strikes = [Strike(20.0, component, kind, xid, precursor, "agent", 100)]
    return run_in_scratch(config, strikes=strikes, timeout=300)


def test_a_precursor_the_sweep_finds_moves_the_job_before_the_strike_hits_the_node():
    warned = _one_strike("GPU HBM3 Memory", "ecc_uncorrectable", 48, "ecc")
    unwarned = _one_strike("GPU HBM3 Memory", "ecc_uncorrectable", 48, "")
    # rising corrected ECC: the sweep's score reaches the threshold, a prediction and its fault, a proactive move
    assert warned["precursors_shown"] == 1 and warned["predictions"] == 1, warned
    predicted, struck = warned["decisions"]
    assert predicted["kind"] == "predicted_failure"
    assert ("proactive_migration", "succeeded") in map(tuple, predicted["actions"]), predicted
    # the strike hits the node the job has left: nothing of the job's to recover, and the prediction came true
    assert struck["kind"] == "ecc_uncorrectable" and struck["gpu_hours_lost"] == 0.0, struck
    assert not any(kind in ("live_migration", "restart_from_checkpoint") for kind, _ in struck["actions"])
    assert warned["predictions_came_true"] == 1 and warned["job_state"] == "Running"
    # unannounced, the same fault is the job's to recover from: a move off the dead GPU, paused as long as the
    # proactive one was (the protected job loses no work either way), so warning saved nothing more here
    assert unwarned["predictions"] == 0
    [unannounced] = unwarned["decisions"]
    assert unannounced["kind"] == "ecc_uncorrectable" and unannounced["gpu_hours_lost"] > 0, unannounced
    assert unwarned["gpu_hours_lost"] >= warned["gpu_hours_lost"]


def test_a_precursor_too_weak_for_the_sweep_raises_no_prediction():
    # a GPU warming 25 °C over 30 h (0.8 °C/h, to 85 °C): under the thermal curve's bar; the detectors that would
    # learn this node's usual temperature are not replayed, so the strike comes unannounced
    warmed = _one_strike("Faulty GPU", "gpu_xid", 79, "thermal")
    assert warmed["precursors_shown"] == 1 and warmed["predictions"] == 0, warmed
    assert [d["kind"] for d in warmed["decisions"]] == ["gpu_xid"]


def test_a_price_row_books_the_recorded_decisions_again(replayed):
    # at the run's own value each price gives back the recorded figure (to its rounding)
    for field in RECOSTED:
        again = recost(replayed, SMALL, field, getattr(SMALL, field))
        assert again == pytest.approx(replayed["effective_training_time"], abs=0.0006), field
    kinds = replayed["by_kind"]
    assert kinds["restart_from_checkpoint"]["succeeded"] >= 1 and kinds["live_migration"]["succeeded"] >= 1
    # dearer prices cost training time, cheaper ones give some back
    base = replayed["effective_training_time"]
    for field, dearer, cheaper in (
        ("checkpoint_write_seconds", 120, 5),
        ("restart_overhead_minutes", 60, 1),
        ("migration_pause_seconds", 3600, 1),
    ):
        assert recost(replayed, SMALL, field, dearer) < base < recost(replayed, SMALL, field, cheaper), field
    # without write stalls, doubling the interval doubles the work the restarts redid, and nothing else
    free_writes = replace(SMALL, checkpoint_write_seconds=0)
    at_30, at_60 = (recost(replayed, free_writes, "checkpoint_minutes", minutes) for minutes in (30, 60))
    restarts = kinds["restart_from_checkpoint"]["work_redone_hours"]
    assert restarts > 0 and at_30 - at_60 == pytest.approx(restarts / (SMALL.days * 24), abs=0.0002)
    with pytest.raises(ValueError):
        recost(replayed, SMALL, "spare_fraction", 0.5)


def test_the_pessimistic_spare_share_lowers_the_protected_figure_through_the_real_path():
    real = real_path_runs(SMALL, replay=("spare_fraction",))
    rows = {row["field"]: row for row in real["sensitivity"]}
    assert set(rows) == {*RECOSTED, "spare_fraction"}
    spares = rows["spare_fraction"]
    assert spares["how"] == "replayed" and rows["checkpoint_write_seconds"]["how"] == "re-costed"
    # 0.5 % of 256 nodes is one spare: the first dead node's ranks take it, a later one finds none
    assert spares["pessimistic"]["protected"] < real["effective_training_time"] - 0.1, spares
    assert spares["optimistic"]["protected"] == real["effective_training_time"]  # 5 %: the run's own share


def test_lemon_nodes_draw_the_hardware_faults_until_the_operator_replaces_them(replayed):
    # the run's own shares: 1.2 % of the nodes are lemons and take 71 % of the hardware faults while the job holds one
    # (fewer here: the predictions their precursors raise move the job off some of them before they fail again)
    assert replayed["lemon_nodes"] >= 1 and replayed["hardware_faults"] >= 10
    assert replayed["hardware_faults_on_lemon_nodes"] > 0.2, replayed
    # every hardware fault on a lemon while the job holds one: never found out, they take most of them (not all: a
    # lemon the job was moved off is in repair or among the spares until a later move brings the job back to it)
    kept = replace(SMALL, days=27.0, lemon_fault_share=1.0, lemon_retire_after=100, repair_hours=2.0)
    stuck = run_in_scratch(kept, timeout=300)
    assert stuck["lemons_retired"] == 0 and stuck["hardware_faults_on_lemon_nodes"] > 0.6, stuck
    # found out at their first repair: the operator replaces them with sound nodes, and later faults land elsewhere
    found_out = run_in_scratch(replace(kept, lemon_retire_after=1), timeout=300)
    assert found_out["lemons_retired"] >= 1, found_out
    assert found_out["hardware_faults_on_lemon_nodes"] < stuck["hardware_faults_on_lemon_nodes"] - 0.3, (
        found_out
    )


def test_a_replay_run_second_in_a_process_gives_what_a_fresh_process_gives():
    # each replay of a process starts from a copy of the migrated schema, with the cache and the simulated driver's
    # seeded failure draws forgotten: what the first replay left cannot move the second
    short = replace(SMALL, days=13.5, failed_recovery_share=0.2)
    fresh = run_in_scratch(short, timeout=300)
    after_another = run_in_scratch_many([replace(short, spare_fraction=0.005, seed=4), short], timeout=300)[1]
    for key in (
        "actions",
        "recoveries",
        "decisions",
        "gpu_hours_lost",
        "effective_training_time",
        "lemon_nodes",
    ):
        assert after_another[key] == fresh[key], key
