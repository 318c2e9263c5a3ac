"""The replay and the live path decide alike (issue 20): the same faults, fed to the product running live (the
suite's PostgreSQL, a real Celery worker deciding, beat's recovery step in a thread, real time) and to the real-path
replay (its scratch process, a virtual clock), give the same decisions and the same ledger. If the replay ever
models the recovery logic instead of running it, or drives it differently from beat and the workers, this fails."""

import time

import pytest
from django.utils import timezone

from jobs.models import FaultEvent, NodeEscalation, RecoveryAction
from jobs.services.escalation import OPEN_STAGES
from jobs.services.faults import FaultReport, fault_ingest_many
from simulator import replay, replay_world
from simulator.sampling import Strike
from simulator.whatif import WhatIfConfig, strike_draws
from tests.support.jobs import INSTANT, beat_in_a_thread
from tests.support.processes import celery_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# 32 nodes and 3 spares; every operation instant, so that real time and the virtual clock see the same pauses; no
# chance failures (the worker and the replay would roll them in whatever order their operations start)
CONFIG = WhatIfConfig(
    seed=5, gpus=256, days=0.02, spare_fraction=0.1, failed_recovery_share=0.0, leaf_failure_share=1.0
)
SECONDS_APART = 8


def _strike(index: int, kind: str, gpu: int, xid: int | None = None, component: str = "") -> Strike:
    at_hours = (index + 1) * SECONDS_APART / 3600
    return Strike(at_hours, component or kind, kind, xid, "", "", gpu)


STRIKES = [
    _strike(0, "nic_down", gpu=3),  # a NIC of node 0: fail over to another rail
    _strike(1, "gpu_xid", gpu=100, xid=79),  # a GPU fallen off the bus on node 12: migrate off the dead node
    _strike(2, "software_crash", gpu=50),  # a crash: restart from the checkpoint
    _strike(3, "gpu_xid", gpu=170, xid=48),  # a double-bit ECC error on node 21
    _strike(4, "ecc_uncorrectable", gpu=220),  # node 27
    # a leaf switch: rail 1 down on each of its 16 nodes (leaf_failure_share 1: every switch fault takes its leaf)
    _strike(5, "nic_down", gpu=137, component="Network Switch/Cable"),
]


def _live(job) -> None:
    """Report each strike at its moment; wait until the worker has decided it and beat has finished its recovery."""
    started, lemons = job.created_at, replay_world.Lemons.of(job.cluster, CONFIG)
    for strike, draw in zip(STRIKES, strike_draws(CONFIG.seed, len(STRIKES)), strict=True):
        pause = (started + timezone.timedelta(hours=strike.at_hours) - timezone.now()).total_seconds()
        time.sleep(max(0.0, pause))
        reports, _ = replay_world.reports_of(strike, draw, job, CONFIG, lemons)
        assert reports, strike
        faults = fault_ingest_many(source="simulator", reports=[FaultReport(**r) for r in reports])
        assert all(created for _, created in faults)
        ids = [fault.pk for fault, _ in faults]
        wait_for(lambda ids=ids: _settled(ids, job), 30, what=f"the live recovery of {strike.kind}")


def _settled(fault_ids, job) -> bool:
    """Decided, nothing planned or running, no escalation ladder open: where the replay moves on too."""
    return (
        not FaultEvent.objects.filter(pk__in=fault_ids, state="new").exists()
        and not RecoveryAction.objects.filter(
            cluster_id=job.cluster_id, state__in=("planned", "running")
        ).exists()
        and not NodeEscalation.objects.filter(node__cluster_id=job.cluster_id, stage__in=OPEN_STAGES).exists()
    )


def test_the_live_path_and_the_replay_decide_the_same(tmp_path):
    cluster, job = replay._world(CONFIG, INSTANT)
    with celery_worker(tmp_path), beat_in_a_thread(cluster_ids=[cluster.pk], interval=0.2):
        _live(job)
    live = replay.decisions_of(job)
    replayed = replay.run_in_scratch(CONFIG, strikes=STRIKES, connection=INSTANT, timeout=300)["decisions"]

    assert [d["kind"] for d in live] == [s.kind for s in STRIKES[:-1]] + ["nic_down"] * 16
    kinds = {kind for d in live for kind, _ in d["actions"]}
    assert {"nic_failover", "live_migration", "restart_from_checkpoint"} <= kinds, live
    assert [d["actions"] for d in replayed] == [d["actions"] for d in live], (live, replayed)
    # the ledger: the same GPU-hours per fault, within what a second of real time can move them
    for ours, theirs in zip(replayed, live, strict=True):
        assert ours["gpu_hours_lost"] == pytest.approx(theirs["gpu_hours_lost"], rel=0.05, abs=0.5), (
            ours,
            theirs,
        )
