"""The simulated driver's injected failures: by chance (recovery_failure_probability) and on demand
(fail_next_recovery, ``manage.py simulate fail-next``), for recovery operations only."""

import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from fleet.drivers import DriverError, driver_for
from fleet.drivers.simulated import fail_next_recovery, set_recovery_failure_probability
from fleet.models import Cluster, SimulatedOperation
from tests.support.factories import make_cluster
from tests.support.jobs import bulk_nodes
from tests.support.processes import lock_waiters, wait_for

pytestmark = pytest.mark.django_db

INSTANT = {
    "apply_seconds": 0,
    "nic_failover_seconds": 0,
    "migration_pause_seconds": 0,
    "gpu_reset_seconds": 0,
    "restart_seconds": 0,
    "snapshot_base_seconds": 0,
    "snapshot_seconds_per_gpu": 0,
}


def simulated_cluster(**connection):
    cluster = make_cluster(connection={**INSTANT, **connection})
    bulk_nodes(cluster, 2, prefix=f"{cluster.name}-n")
    return cluster


def recovery_calls(cluster):
    """Each recovery operation the simulated driver offers, as a call on a driver for ``cluster``."""
    source, destination = cluster.nodes.order_by("hostname")
    return {
        "nic_failover": lambda driver: driver.fail_over_nic(source, "mlx5_0", "mlx5_1"),
        "migrate_worker": lambda driver: driver.migrate_worker("job-1", source, destination, 8),
        "gpu_reset": lambda driver: driver.reset_gpu(source, 3),
        "restart_from_checkpoint": lambda driver: driver.restart_from_checkpoint("job-1"),
        "restore_from_snapshot": lambda driver: driver.restore_from_snapshot("job-1", "snap-1"),
    }


def other_calls(cluster):
    """The operations that never fail by injection: add-ons, node operations and snapshots."""
    node = cluster.nodes.order_by("hostname").first()
    return {
        "apply_addon": lambda driver: driver.apply_addon(
            {"name": "gpu-operator", "chart": "gpu-operator", "version": "24.9.0"}
        ),
        "cordon": lambda driver: driver.cordon(node),
        "uncordon": lambda driver: driver.uncordon(node),
        "drain": lambda driver: driver.drain(node),
        "taint": lambda driver: driver.taint(node, "lockstep/risk", "high", "NoSchedule"),
        "snapshot": lambda driver: driver.snapshot("job-1", 8),
    }


def status(cluster, result) -> str:
    return driver_for(Cluster.objects.get(pk=cluster.pk)).operation_status(result.handle)


def run_restarts(cluster, times: int) -> list[str]:
    driver = driver_for(cluster)
    results = [driver.restart_from_checkpoint(f"job-{i}") for i in range(times)]
    return list(driver.operation_statuses([result.handle for result in results]).values())


def test_without_the_setting_recovery_operations_succeed():
    cluster = simulated_cluster()
    driver = driver_for(cluster)
    for name, call in recovery_calls(cluster).items():
        for _ in range(20):
            assert status(cluster, call(driver)) == "succeeded", name
    assert not SimulatedOperation.objects.filter(cluster=cluster, fails=True).exists()


def test_probability_one_fails_every_recovery_operation_and_nothing_else():
    cluster = simulated_cluster(recovery_failure_probability=1.0)
    driver = driver_for(cluster)
    for name, call in recovery_calls(cluster).items():
        result = call(driver)
        assert result.handle.startswith("sim-") and result.done_at is not None
        assert status(cluster, result) == "failed", name
    for name, call in other_calls(cluster).items():
        result = call(driver)
        if result.handle.startswith("sim-"):
            assert status(cluster, result) == "succeeded", name
    node = cluster.nodes.order_by("hostname").first()
    assert driver.drain_done(node)
    assert set(
        SimulatedOperation.objects.filter(cluster=cluster, fails=True).values_list("operation", flat=True)
    ) == {"nic_failover", "migrate_worker", "gpu_reset", "restart_from_checkpoint", "restore_from_snapshot"}
    assert [addon.health for addon in driver.observe_addons()] == ["Healthy"]
    driver.remove_addon("gpu-operator")
    assert driver.observe_addons() == []


def test_a_share_of_recovery_operations_fails_and_a_seed_repeats_the_same_ones():
    first = simulated_cluster(recovery_failure_probability=0.5, recovery_failure_seed=11)
    second = simulated_cluster(recovery_failure_probability=0.5, recovery_failure_seed=11)
    statuses = run_restarts(first, 40)
    assert 5 < statuses.count("failed") < 35
    assert run_restarts(second, 40) == statuses


def test_fail_next_fails_exactly_the_next_recovery_operations():
    cluster = simulated_cluster()
    assert "2" in fail_next_recovery(cluster, count=2)
    driver = driver_for(cluster)
    node = cluster.nodes.order_by("hostname").first()
    assert status(cluster, driver.cordon(node)) == "succeeded"  # not a recovery operation: nothing consumed
    assert run_restarts(cluster, 3) == ["failed", "failed", "succeeded"]
    assert "fail_next" not in cluster.connection
    assert "fail_next" not in Cluster.objects.get(pk=cluster.pk).connection


def test_fail_next_only_fails_the_operations_named():
    cluster = simulated_cluster()
    fail_next_recovery(cluster, operations=["migrate_worker"])
    calls = recovery_calls(cluster)
    driver = driver_for(cluster)
    assert status(cluster, calls["restart_from_checkpoint"](driver)) == "succeeded"
    assert status(cluster, calls["nic_failover"](driver)) == "succeeded"
    assert status(cluster, calls["migrate_worker"](driver)) == "failed"
    assert status(cluster, calls["migrate_worker"](driver)) == "succeeded"


def test_refuse_raises_a_lasting_driver_error_and_starts_nothing():
    cluster = simulated_cluster()
    fail_next_recovery(cluster, how="refuse", operations=["restart_from_checkpoint"])
    driver = driver_for(cluster)
    with pytest.raises(DriverError) as refused:
        driver.restart_from_checkpoint("job-1")
    assert not refused.value.transient and cluster.name in str(refused.value)
    assert not SimulatedOperation.objects.filter(cluster=cluster).exists()
    assert status(cluster, driver.restart_from_checkpoint("job-1")) == "succeeded"


def test_the_pending_count_is_stored_and_a_fresh_driver_sees_what_is_left():
    cluster = simulated_cluster(apply_seconds=7)
    fail_next_recovery(cluster, count=3, operations=["gpu_reset"])
    fail_next_recovery(cluster, how="refuse")
    node = cluster.nodes.order_by("hostname").first()
    assert status(cluster, driver_for(cluster).reset_gpu(node, 0)) == "failed"
    stored = Cluster.objects.get(pk=cluster.pk).connection
    assert stored["fail_next"] == [
        {"how": "fail", "operations": ["gpu_reset"], "count": 2},
        {"how": "refuse", "operations": [], "count": 1},
    ]
    assert stored["apply_seconds"] == 7  # the other settings are kept

    fresh = driver_for(Cluster.objects.get(pk=cluster.pk))
    with pytest.raises(DriverError):
        fresh.restart_from_checkpoint("job-1")  # the refusal covers any operation; gpu_reset's are not its
    assert [status(cluster, fresh.reset_gpu(node, 0)) for _ in range(3)] == ["failed", "failed", "succeeded"]
    assert "fail_next" not in Cluster.objects.get(pk=cluster.pk).connection


def test_a_driver_built_before_the_failure_was_queued_is_counted_down_from_the_stored_row():
    cluster = simulated_cluster()
    fail_next_recovery(cluster)
    stale = Cluster.objects.get(pk=cluster.pk)
    fail_next_recovery(Cluster.objects.get(pk=cluster.pk), count=2)  # another process queues more
    assert run_restarts(stale, 4) == ["failed", "failed", "failed", "succeeded"]


def waiting_for_locks() -> int:
    # A transaction reads pg_stat_activity once and keeps that snapshot; drop it to see the other session wait.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
    return lock_waiters()


@pytest.mark.django_db(transaction=True)
def test_a_failure_queued_while_a_decision_holds_the_cluster_waits_and_loses_no_count():
    cluster = simulated_cluster()
    fail_next_recovery(cluster, count=2)

    def queue_more():
        try:
            fail_next_recovery(Cluster.objects.get(pk=cluster.pk), operations=["gpu_reset"])
        finally:
            connection.close()

    queuer = threading.Thread(target=queue_more)
    with transaction.atomic():
        locked = Cluster.objects.select_for_update(no_key=True).get(
            pk=cluster.pk
        )  # as the fault path holds it
        queuer.start()
        wait_for(lambda: waiting_for_locks() > 0, 10, what="fail_next_recovery to wait for the cluster row")
        assert status(cluster, driver_for(locked).restart_from_checkpoint("job-1")) == "failed"
    queuer.join(10)
    assert not queuer.is_alive()
    assert Cluster.objects.get(pk=cluster.pk).connection["fail_next"] == [
        {"how": "fail", "operations": [], "count": 1},
        {"how": "fail", "operations": ["gpu_reset"], "count": 1},
    ]


def test_fail_next_refuses_what_it_cannot_do():
    cluster = simulated_cluster()
    with pytest.raises(DriverError, match="not recovery operations: snapshot"):
        fail_next_recovery(cluster, operations=["snapshot"])
    with pytest.raises(DriverError):
        fail_next_recovery(cluster, how="explode")
    with pytest.raises(DriverError):
        fail_next_recovery(cluster, count=0)
    with pytest.raises(DriverError, match="not simulated"):
        fail_next_recovery(make_cluster(driver="kubernetes"))
    assert "fail_next" not in Cluster.objects.get(pk=cluster.pk).connection


def test_the_probability_can_be_set_and_removed():
    cluster = simulated_cluster()
    set_recovery_failure_probability(cluster, probability=1.0)
    assert run_restarts(Cluster.objects.get(pk=cluster.pk), 2) == ["failed", "failed"]
    set_recovery_failure_probability(cluster, probability=0)
    assert "recovery_failure_probability" not in Cluster.objects.get(pk=cluster.pk).connection
    with pytest.raises(DriverError):
        set_recovery_failure_probability(cluster, probability=1.5)


def test_simulate_fail_next_command():
    cluster = simulated_cluster()
    out = StringIO()
    call_command(
        "simulate",
        "fail-next",
        "--cluster",
        cluster.name,
        "--count",
        "2",
        "--operation",
        "migrate_worker",
        "--operation",
        "nic_failover",
        "--how",
        "refuse",
        stdout=out,
    )
    assert cluster.name in out.getvalue()
    assert Cluster.objects.get(pk=cluster.pk).connection["fail_next"] == [
        {"how": "refuse", "operations": ["migrate_worker", "nic_failover"], "count": 2}
    ]
    fresh = driver_for(Cluster.objects.get(pk=cluster.pk))
    calls = recovery_calls(cluster)
    for name in ("nic_failover", "migrate_worker"):
        with pytest.raises(DriverError):
            calls[name](fresh)
    assert status(cluster, calls["migrate_worker"](fresh)) == "succeeded"


def test_simulate_fail_next_command_refuses_bad_input():
    cluster = simulated_cluster()
    with pytest.raises(CommandError, match="no cluster named nope"):
        call_command("simulate", "fail-next", "--cluster", "nope")
    with pytest.raises(CommandError):
        call_command("simulate", "fail-next", "--cluster", cluster.name, "--count", "0")
    with pytest.raises(CommandError):
        call_command("simulate", "fail-next", "--cluster", cluster.name, "--operation", "snapshot")
