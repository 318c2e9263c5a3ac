"""The cost-ranked planner and the ledger, case by case (plain functions)."""

import pytest

from jobs.ledger import actual_gpu_hours, baseline_gpu_hours, ledger
from jobs.planner import Estimates, JobFacts, Situation, fair_order, plan, plan_with_spare_lookup

EST = Estimates(
    nic_failover=1,
    migration_pause=30,
    intra_node_pause=10,
    gpu_reset=20,
    restore_pause=30,
    nic_degraded_seconds=1800,
    nic_slowdown=0.01,
)


def job(**overrides):
    base = dict(
        gpus=64, gpus_affected=8, seconds_since_checkpoint=1800, protected=True, restart_overhead_seconds=600
    )
    base.update(overrides)
    return JobFacts(**base)


def test_ledger_formula():
    assert baseline_gpu_hours(
        gpus=64, seconds_since_checkpoint=1800, restart_overhead_seconds=600
    ) == pytest.approx(64 * 2400 / 3600)
    assert actual_gpu_hours(gpus=64, pause_seconds=30) == pytest.approx(64 * 30 / 3600)
    assert actual_gpu_hours(
        gpus=10, pause_seconds=1, work_lost_seconds=9, degraded_seconds=100, slowdown=0.5
    ) == pytest.approx(10 * 60 / 3600)
    result = ledger(gpus=8, seconds_since_checkpoint=3600, restart_overhead_seconds=0, pause_seconds=0)
    assert result.saved == pytest.approx(8.0)


def test_node_loss_live_migrates_to_a_spare():
    chosen = plan(job(), Situation(impact="node", spare_node=True), EST).chosen
    assert chosen.kind == "live_migration"
    assert chosen.gpu_hours_lost == pytest.approx(64 * 30 / 3600)


def test_without_spares_the_job_restarts_from_checkpoint():
    decision = plan(job(), Situation(impact="node", spare_node=False), EST)
    assert decision.chosen.kind == "restart_from_checkpoint"
    assert decision.chosen.gpu_hours_lost == pytest.approx(decision.baseline)
    live = next(o for o in decision.options if o.kind == "live_migration")
    assert not live.feasible and live.why == "no spare node"


def test_unprotected_jobs_can_only_restart():
    decision = plan(
        job(protected=False), Situation(impact="node", spare_node=True, spare_gpus_on_node=4), EST
    )
    assert decision.chosen.kind == "restart_from_checkpoint"
    assert all(not o.feasible for o in decision.options if o.kind != "restart_from_checkpoint")
    assert "not protected" in decision.reason


def test_gpu_loss_prefers_a_spare_gpu_on_the_same_node():
    decision = plan(
        job(gpus_affected=1),
        Situation(impact="device", spare_gpus_on_node=1, spare_node=True, gpu_reset=True),
        EST,
    )
    assert decision.chosen.kind == "intra_node_migration"
    kinds = [o.kind for o in decision.options]
    assert {"live_migration", "gpu_reset", "restart_from_checkpoint"} <= set(kinds)


def test_nic_down_fails_over_when_a_healthy_nic_remains():
    assert (
        plan(job(), Situation(impact="nic", healthy_nic=True, spare_node=True), EST).chosen.kind
        == "nic_failover"
    )
    assert (
        plan(job(), Situation(impact="nic", healthy_nic=False, spare_node=True), EST).chosen.kind
        == "live_migration"
    )


def test_degraded_link_fails_over_and_unprotected_jobs_ride_it_out():
    assert plan(job(), Situation(impact="degraded", healthy_nic=True), EST).chosen.kind == "nic_failover"
    assert plan(job(protected=False), Situation(impact="degraded", healthy_nic=True), EST).chosen is None


def test_fresh_snapshot_is_a_cheaper_restore_point():
    decision = plan(job(seconds_since_snapshot=60), Situation(impact="restart"), EST)
    assert decision.chosen.kind == "restore_from_snapshot"
    assert plan(job(), Situation(impact="restart"), EST).chosen.kind == "restart_from_checkpoint"


def test_just_after_a_checkpoint_restart_can_beat_a_long_budget_wait():
    fresh = job(seconds_since_checkpoint=0, restart_overhead_seconds=60)
    assert (
        plan(fresh, Situation(impact="node", spare_node=True, spare_wait_seconds=600), EST).chosen.kind
        == "restart_from_checkpoint"
    )
    assert (
        plan(fresh, Situation(impact="node", spare_node=True, spare_wait_seconds=0), EST).chosen.kind
        == "live_migration"
    )


def test_predicted_failure_moves_a_job_early_only_when_worth_it():
    assert (
        plan(job(), Situation(impact="risk", spare_node=True, risk=0.9), EST).chosen.kind
        == "proactive_migration"
    )
    assert plan(job(), Situation(impact="risk", spare_node=False), EST).chosen is None


def test_driver_that_cannot_migrate_leaves_restart():
    decision = plan(
        job(), Situation(impact="node", spare_node=True, supports=frozenset({"restart_from_checkpoint"})), EST
    )
    assert decision.chosen.kind == "restart_from_checkpoint"


class SpareLookUp:
    """A spare pool stand-in that counts how often it was asked."""

    def __init__(self, available: bool, wait: float = 0.0):
        self.answer, self.calls = (available, wait), 0

    def __call__(self):
        self.calls += 1
        return self.answer


def test_a_nic_failover_is_chosen_without_looking_for_spares():
    look_up = SpareLookUp(True)
    decision, looked = plan_with_spare_lookup(job(), Situation(impact="nic", healthy_nic=True), EST, look_up)
    assert decision.chosen.kind == "nic_failover" and not looked and look_up.calls == 0
    live = next(o for o in decision.options if o.kind == "live_migration")
    # Its price is the best a spare could do (free now, no wait), and it says it was not looked up.
    assert live.gpu_hours_lost == pytest.approx(64 * 30 / 3600)
    assert "not looked up" in live.why and "nic_failover" in live.why
    assert (
        decision.chosen == plan(job(), Situation(impact="nic", healthy_nic=True, spare_node=True), EST).chosen
    )


def test_spares_are_looked_up_when_one_could_win():
    look_up = SpareLookUp(True, wait=0.0)
    decision, looked = plan_with_spare_lookup(job(), Situation(impact="node"), EST, look_up)
    assert looked and look_up.calls == 1 and decision.chosen.kind == "live_migration"
    # No spare after all: the real plan says so, as plan() would.
    decision, looked = plan_with_spare_lookup(job(), Situation(impact="node"), EST, SpareLookUp(False))
    assert looked and decision.chosen.kind == "restart_from_checkpoint"
    live = next(o for o in decision.options if o.kind == "live_migration")
    assert not live.feasible and live.why == "no spare node"


def test_a_long_budget_wait_found_on_lookup_can_lose_to_a_restart():
    facts = job(seconds_since_checkpoint=10, restart_overhead_seconds=60)
    decision, looked = plan_with_spare_lookup(
        facts, Situation(impact="node"), EST, SpareLookUp(True, wait=600)
    )
    assert looked and decision.chosen.kind == "restart_from_checkpoint"
    assert decision == plan(facts, Situation(impact="node", spare_node=True, spare_wait_seconds=600), EST)


def test_the_lazy_plan_chooses_what_the_full_plan_chooses():
    """Whatever the pool holds, looking it up only when needed never changes the choice."""
    for impact in ("nic", "node", "device", "risk", "degraded", "restart"):
        for healthy_nic in (True, False):
            for available, wait in ((True, 0.0), (True, 90.0), (False, 0.0)):
                for since in (10, 1800):
                    facts = job(seconds_since_checkpoint=since)
                    base = Situation(impact=impact, healthy_nic=healthy_nic, spare_gpus_on_node=1, risk=0.9)
                    full = plan(
                        facts,
                        Situation(
                            impact=impact,
                            healthy_nic=healthy_nic,
                            spare_gpus_on_node=1,
                            risk=0.9,
                            spare_node=available,
                            spare_wait_seconds=wait,
                        ),
                        EST,
                    )
                    lazy, _ = plan_with_spare_lookup(facts, base, EST, SpareLookUp(available, wait))
                    assert (lazy.chosen.kind if lazy.chosen else None) == (
                        full.chosen.kind if full.chosen else None
                    ), (impact, healthy_nic, available, wait, since)


def test_fair_order_by_tier_then_stake():
    requests = [
        (1, "standard", 10.0, "a1"),
        (1, "standard", 30.0, "a2"),
        (1, "standard", 20.0, "a3"),
        (2, "resilient", 5.0, "b1"),
        (2, "resilient", 1.0, "b2"),
    ]
    order = fair_order(requests)
    assert order[:3] == ["b1", "a2", "b2"]  # a resilient tenant gets two turns per standard turn
    assert order[3:] == ["a3", "a1"]
    assert fair_order([(1, "standard", s, s) for s in (3.0, 9.0, 5.0)]) == [9.0, 5.0, 3.0]
