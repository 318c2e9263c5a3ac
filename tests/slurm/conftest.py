"""A real Slurm per test (controlplane/testing/slurm.py) and a Lockstep cluster on it.

Tests here skip, with the reason, only when Slurm's binaries are missing (``.ci/run`` installs them); torch is
imported only by the training job the tests submit."""

import pytest

from fleet.choices import ClusterKind, DriverName
from tests.fleet_factories import make_cluster, make_fleet


@pytest.fixture
def slurm(tmp_path):
    from controlplane.testing.slurm import SlurmCluster, available

    why = available()
    if why:
        pytest.skip(why)
    with SlurmCluster(tmp_path / "slurm", nodes=3, spare_nodes=1) as cluster:
        yield cluster


@pytest.fixture
def slurm_cluster(slurm, tenant_a):
    """A Lockstep cluster on the test Slurm: account ``acme`` is tenant A's; its nodes synced in."""
    from jobs.services.slurm_jobs import slurm_sync

    cluster = make_cluster(
        make_fleet(),
        driver=DriverName.SLURM,
        kind=ClusterKind.SLURM,
        connection=slurm.connection(accounts={"acme": tenant_a.slug}, gpu_model="H100"),
    )
    slurm_sync(cluster=cluster)
    return cluster
