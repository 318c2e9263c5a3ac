from io import StringIO
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from fleet.models import Cluster, DriftFinding, SimulatedAddon
from fleet.services.drift import drift_sweep
from simulator.world import DEMO_RECOVERY_FAILURE_PROBABILITY
from tests.support.blueprints import blueprint, clusters_on

pytestmark = pytest.mark.django_db


def test_simulate_drift_changes_the_cluster_out_of_band_and_the_sweep_sees_it(users):
    _, v1 = blueprint(users["operator"])
    (cluster,) = clusters_on(v1, 1)
    out = StringIO()
    call_command(
        "simulate",
        "drift",
        "--cluster",
        cluster.name,
        "--addon",
        "gpu-operator",
        "--version",
        "25.1.0",
        stdout=out,
    )
    assert "gpu-operator" in out.getvalue()
    assert SimulatedAddon.objects.get(cluster=cluster, name="gpu-operator").version == "25.1.0"
    call_command("simulate", "drift", "--cluster", cluster.name, "--kind", "extra", stdout=StringIO())
    drift_sweep()
    assert set(DriftFinding.objects.values_list("kind", flat=True)) == {"version_mismatch", "unexpected"}


def test_simulate_drift_refuses_unknown_clusters_and_add_ons(users):
    _, v1 = blueprint(users["operator"])
    (cluster,) = clusters_on(v1, 1)
    with pytest.raises(CommandError):
        call_command("simulate", "drift", "--cluster", "nope")
    with pytest.raises(CommandError):
        call_command("simulate", "drift", "--cluster", cluster.name, "--addon", "nope")


def test_simulate_world_leaves_recovery_operations_alone_and_run_fails_a_share(monkeypatch):
    call_command("simulate", "world", "--nodes", "4", "--spares", "1", stdout=StringIO())
    assert [c.connection.get("recovery_failure_probability") for c in Cluster.objects.all()] == [None] * 4
    monkeypatch.setattr("requests.get", lambda *args, **kwargs: SimpleNamespace(ok=True))
    out = StringIO()
    call_command("simulate", "run", "--nodes", "4", "--spares", "1", "--ticks", "0", stdout=out)
    assert "5% of recovery operations fail" in out.getvalue()
    assert [c.connection.get("recovery_failure_probability") for c in Cluster.objects.all()] == [
        DEMO_RECOVERY_FAILURE_PROBABILITY
    ] * 4
    assert all(c.connection["apply_seconds"] == 20 for c in Cluster.objects.all())


def test_simulate_fail_health_check_queues_failing_checks_only_for_health_checks(users):
    from fleet.drivers import driver_for
    from fleet.drivers.base import Operation
    from fleet.models import SimulatedOperation
    from tests.support.factories import make_node

    _, v1 = blueprint(users["operator"])
    (cluster,) = clusters_on(v1, 1)
    node = make_node(cluster)
    out = StringIO()
    call_command("simulate", "fail-health-check", "--cluster", cluster.name, stdout=out)
    assert out.getvalue() == f"the next 1 health check(s) on {cluster.name} will fail\n"
    cluster.refresh_from_db()
    driver = driver_for(cluster)
    driver.restart_from_checkpoint("job-1")  # a recovery operation does not take the health check's failure
    assert not SimulatedOperation.objects.get(operation=Operation.RESTART_FROM_CHECKPOINT.value).fails
    first, second = driver.health_check(node), driver.health_check(node)
    assert driver.operation_status(first.handle) == "failed"
    assert SimulatedOperation.objects.get(pk=int(second.handle.removeprefix("sim-"))).fails is False
    # a failure queued for any recovery operation is not spent on a health check
    call_command("simulate", "fail-next", "--cluster", cluster.name, stdout=StringIO())
    cluster.refresh_from_db()
    driver = driver_for(cluster)
    driver.health_check(node)
    assert not SimulatedOperation.objects.filter(operation="health_check").order_by("-pk").first().fails
    assert driver.operation_status(driver.restart_from_checkpoint("job-2").handle) == "failed"
    with pytest.raises(CommandError):
        call_command("simulate", "fail-health-check", "--cluster", "nope")
