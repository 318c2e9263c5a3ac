"""A real Slurm per test (jobs/local_slurm/cluster.py) and a Lockstep cluster on it.

Tests here skip, with the reason, only when Slurm's binaries are missing (``.ci/run`` installs them); torch is
imported only by the training job the tests submit."""

import pytest

from fleet.choices import ClusterKind, DriverName
from tests.support.factories import make_cluster, make_fleet


@pytest.fixture
def slurm(tmp_path):
    from jobs.local_slurm.cluster import SlurmCluster, available

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


def _runtime_cluster(slurm, tenant):
    """A Lockstep cluster on ``slurm`` whose blueprint policy turns the protection runtime on."""
    from fleet.models import BlueprintVersion
    from jobs.services.slurm_jobs import slurm_sync
    from tests.support.factories import make_blueprint

    _, version = make_blueprint()
    BlueprintVersion.objects.filter(pk=version.pk).update(policy={"protection": {"runtime": True}})
    version.refresh_from_db()
    cluster = make_cluster(
        make_fleet(),
        driver=DriverName.SLURM,
        kind=ClusterKind.SLURM,
        blueprint_version=version,
        connection=slurm.connection(accounts={"acme": tenant.slug}, gpu_model="H100"),
    )
    slurm_sync(cluster=cluster)
    return cluster


def _holders(tmp_path, **sizes):
    from jobs.local_slurm.cluster import SlurmCluster, available

    why = available()
    if why:
        pytest.skip(why)
    return SlurmCluster(tmp_path / "slurm", holders=True, **sizes)


@pytest.fixture
def slurm_holders(tmp_path):
    """The test Slurm (2 training nodes + 1 hot spare) with a snapshot holder per node (a node daemon, as the
    protection runtime needs)."""
    with _holders(tmp_path, nodes=3, spare_nodes=1) as cluster:
        yield cluster


@pytest.fixture
def protected_slurm_cluster(slurm_holders, tenant_a):
    return _runtime_cluster(slurm_holders, tenant_a)


@pytest.fixture
def ab_slurm(tmp_path):
    """Room for two jobs, one of them with a standby in its allocation: 5 training nodes + 2 hot spares, a snapshot
    holder on each; one CPU a node, so the two jobs (one task a node) never share one."""
    with _holders(tmp_path, nodes=7, spare_nodes=2, cpus=1) as cluster:
        yield cluster


@pytest.fixture
def ab_cluster(ab_slurm, tenant_a):
    return _runtime_cluster(ab_slurm, tenant_a)


@pytest.fixture
def standby_slurm(tmp_path):
    """Room for a job with a standby in its allocation (n1 + n2 train, n3 waits) and one idle spare (n4) for the
    standby Lockstep starts after a replacement; a snapshot holder on each node."""
    with _holders(tmp_path, nodes=4, spare_nodes=1) as cluster:
        yield cluster


@pytest.fixture
def standby_cluster(standby_slurm, tenant_a):
    return _runtime_cluster(standby_slurm, tenant_a)
