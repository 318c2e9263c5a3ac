from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import DriftFinding, SimulatedAddon
from fleet.services.drift import drift_sweep
from tests.fleet.helpers import blueprint, clusters_on

pytestmark = pytest.mark.django_db


def test_simulate_drift_changes_the_cluster_out_of_band_and_the_sweep_sees_it(users):
    _, v1 = blueprint(users["operator"])
    (cluster,) = clusters_on(v1, 1)
    out = StringIO()
    call_command("simulate", "drift", "--cluster", cluster.name, "--addon", "gpu-operator", "--version", "25.1.0",
                 stdout=out)
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
