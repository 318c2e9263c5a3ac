"""The storm, with a real prefork Celery worker against PostgreSQL: 64 of 1,024 nodes fail within one second,
32 spares, a budget of 8 concurrent migrations (4 per leaf switch), and some of the migrations fail."""

import itertools
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from fleet.choices import NodeState
from fleet.drivers.simulated import fail_next_recovery
from jobs.choices import ActionKind, ActionState, FaultState, JobState
from jobs.models import FaultEvent, Job, JobAllocation, RecoveryAction, SpareBooking
from jobs.services.faults import fault_ingest
from tests.support.factories import make_cluster, make_fleet
from tests.support.jobs import beat_in_a_thread, bulk_nodes, protect
from tests.support.processes import celery_worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BUDGET, PER_LEAF = 8, 4


def build(tenant):
    fleet = make_fleet(max_cordoned_nodes=64, max_draining_nodes=16)
    cluster = make_cluster(
        fleet,
        max_concurrent_migrations=BUDGET,
        max_migrations_per_leaf=PER_LEAF,
        connection={"migration_pause_seconds": 1.5, "restart_seconds": 1, "nic_failover_seconds": 0.5},
    )
    protect(cluster)
    nodes = bulk_nodes(cluster, 1024, prefix="gpu", per_leaf=32)
    bulk_nodes(cluster, 32, state=NodeState.SPARE, prefix="spare", per_leaf=4)
    now = timezone.now()
    # 128 jobs of 8 nodes (64 GPUs); job i has run 10 × i seconds longer since its checkpoint than job 0.
    jobs = Job.objects.bulk_create(
        [
            Job(
                tenant=tenant,
                cluster=cluster,
                name=f"storm-{i}",
                gpus=64,
                state=JobState.RUNNING,
                seconds_per_iteration=1.0,
                checkpoint_interval=10**9,
                iteration_at=now - timedelta(seconds=600 + 10 * i),
                started_at=now,
            )
            for i in range(128)
        ]
    )
    JobAllocation.objects.bulk_create(
        [
            JobAllocation(
                job=job,
                node=nodes[8 * i + k],
                gpu_indices=list(range(8)),
                rank_start=8 * k,
                rank_end=8 * k + 7,
            )
            for i, job in enumerate(jobs)
            for k in range(8)
        ]
    )
    return cluster, jobs, nodes


def max_overlap(intervals):
    """The most intervals open at one instant."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, step in points:
        open_now += step
        peak = max(peak, open_now)
    return peak


def overlapping(intervals) -> bool:
    """Whether any two (start, end or None) intervals overlap."""
    ordered = sorted((start, end or timezone.now()) for start, end in intervals)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ordered))


# Short back-offs and a one-second wait for a spare, so the restarts that find no healthy node wait, then give up
# within the test (in the worker and here).
RETRIES = {
    "RECOVERY_RESTART_RETRIES": 1,
    "RECOVERY_RETRY_BACKOFF_SECONDS": 0.2,
    "RECOVERY_SPARE_WAIT_SECONDS": 1.0,
}
FAILING_MIGRATIONS = 4


def test_storm_books_each_spare_once_keeps_the_budget_and_every_recovery_ends(tmp_path, tenant_a, settings):
    for name, value in RETRIES.items():
        setattr(settings, name, value)
    cluster, jobs, nodes = build(tenant_a)
    fail_next_recovery(cluster, count=FAILING_MIGRATIONS, operations=["migrate_worker"])
    failing = [nodes[8 * i + 3] for i in range(64)]  # one node of each of 64 jobs
    samples, stop = [], threading.Event()

    def sample_budget():
        try:
            while not stop.is_set():
                running = RecoveryAction.objects.filter(
                    cluster=cluster, state=ActionState.RUNNING, kind=ActionKind.LIVE_MIGRATION
                )
                per_leaf = list(
                    running.values("to_node__leaf_switch").annotate(n=Count("id")).values_list("n", flat=True)
                )
                samples.append((sum(per_leaf), max(per_leaf, default=0)))
                time.sleep(0.02)
        finally:
            connection.close()

    t0 = timezone.now()

    def report(chunk):
        try:
            for node in chunk:
                # The simulator's detection times: all 64 within one second.
                detected = t0 + timedelta(milliseconds=(node.pk * 7919) % 1000)
                fault_ingest(source="simulator", kind="node_unreachable", node=node, detected_at=detected)
        finally:
            connection.close()

    def settled():
        under_way = RecoveryAction.objects.filter(
            job__isnull=False, state__in=(ActionState.PLANNED, ActionState.RUNNING)
        )
        return not under_way.exists() and not Job.objects.filter(state=JobState.RECOVERING).exists()

    with (
        celery_worker(tmp_path, concurrency=4, **RETRIES) as worker,
        beat_in_a_thread(cluster_ids=[cluster.pk]),
    ):
        watchers = [threading.Thread(target=sample_budget)]
        for thread in watchers:
            thread.start()
        started = time.monotonic()
        reporters = [threading.Thread(target=report, args=(failing[i::8],)) for i in range(8)]
        for thread in reporters:
            thread.start()
        for thread in reporters:
            thread.join()
        reported_in = time.monotonic() - started
        try:
            wait_for(
                lambda: not FaultEvent.objects.filter(state=FaultState.NEW).exists(),
                60,
                0.2,
                what="every fault handled",
            )
            wait_for(settled, 90, 0.3, what="every recovery ended")
        finally:
            stop.set()
            for thread in watchers:
                thread.join()
        log = worker.log.read_text()
    # How fast a storm is taken in is bench/fault_storm.py's to measure, not a wall-clock bound here (it failed
    # only on a loaded machine); the test shows the figure.
    print(f"the 64 faults took {reported_in:.2f} s to report")
    assert "Traceback" not in log, log[-3000:]
    faults = FaultEvent.objects.filter(cluster=cluster)
    assert faults.count() == 64 and set(faults.values_list("state", flat=True)) == {FaultState.HANDLED}
    detected = sorted(faults.values_list("detected_at", flat=True))
    assert (detected[-1] - detected[0]).total_seconds() < 1.0
    actions = RecoveryAction.objects.filter(cluster=cluster, job__isnull=False)
    first = actions.filter(attempt=1)
    # One recovery per fault and job, decided once; every attempt ended, and each failed one was followed by the
    # next attempt or ended its job.
    assert first.count() == 64 and first.values("fault", "job").distinct().count() == 64
    assert not actions.filter(state__in=(ActionState.PLANNED, ActionState.RUNNING)).exists()
    followed = set(actions.filter(previous__isnull=False).values_list("previous_id", flat=True))
    for action in actions.filter(state=ActionState.FAILED):
        assert action.pk in followed or action.job.state == JobState.FAILED, (action.kind, action.error)
    migrations = first.filter(kind=ActionKind.LIVE_MIGRATION)
    restarts = first.filter(kind=ActionKind.RESTART_FROM_CHECKPOINT)
    assert migrations.count() == 32 and restarts.count() == 32, (
        sorted(first.values_list("kind", flat=True)),
        first.order_by("pk").first().alternatives,
    )
    # The injected failures: that many migrations failed, and their recoveries fell back.
    failed_moves = actions.filter(
        kind=ActionKind.LIVE_MIGRATION,
        state=ActionState.FAILED,
        error="the cluster reported the operation failed",
    )
    assert failed_moves.count() == FAILING_MIGRATIONS
    assert all(a.pk in followed for a in failed_moves)
    # No spare booked twice at once (a spare a failed migration gave back may be booked again later).
    for node_id in set(SpareBooking.objects.values_list("node", flat=True)):
        assert not overlapping(
            SpareBooking.objects.filter(node_id=node_id).values_list("booked_at", "released_at")
        )
    # Jobs beyond the spares chose restart from checkpoint, having weighed live migration without a spare.
    for action in restarts:
        live = next(o for o in action.alternatives if o["kind"] == "live_migration")
        assert not live["feasible"] and live["why"] == "no spare node"
    # Every job ended Running or Failed (with its reason), none on a failed node, no node held by two jobs.
    states = dict(Job.objects.filter(cluster=cluster).values_list("pk", "state"))
    assert set(states.values()) <= {JobState.RUNNING, JobState.FAILED}
    assert all(
        Job.objects.get(pk=pk).state_reason for pk, state in states.items() if state == JobState.FAILED
    )
    held = list(
        JobAllocation.objects.filter(job__cluster=cluster, released_at__isnull=True).values_list(
            "node_id", flat=True
        )
    )
    assert len(held) == len(set(held)) and not set(held) & {node.pk for node in failing}
    assert sum(state == JobState.RUNNING for state in states.values()) >= 64 + 32 - FAILING_MIGRATIONS
    # The budget held at every instant: sampled while it ran, and from the recorded intervals.
    assert samples and max(total for total, _ in samples) <= BUDGET
    assert max(leaf for _, leaf in samples) <= PER_LEAF
    intervals = list(
        actions.filter(kind=ActionKind.LIVE_MIGRATION)
        .exclude(started_at=None)
        .values_list("started_at", "ended_at")
    )
    assert max_overlap(intervals) <= BUDGET
