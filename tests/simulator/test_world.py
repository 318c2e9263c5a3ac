import pytest

from fleet.choices import NodeState
from fleet.models import Cluster, Node
from fleet.models.drift import DriftFinding
from fleet.models.rollouts import Rollout
from fleet.selectors import cluster_protection
from jobs.models import Job
from simulator.models import SimWorld
from simulator.world import world_build
from tenancy.models import Tenant

pytestmark = pytest.mark.django_db


def test_world_has_everything_the_demo_needs():
    built = world_build(seed=7, nodes_per_cluster=24, spares=4)
    assert built.created and set(built.passwords) == {
        "acme-admin",
        "acme-viewer",
        "nimbus-admin",
        "nimbus-viewer",
    }
    assert Tenant.objects.count() == 2 and Cluster.objects.count() == 4
    assert Node.objects.filter(state=NodeState.SPARE).count() == 16
    assert {c.blueprint_version.blueprint.name for c in Cluster.objects.all()} == {
        "gpu-base",
        "gpu-resilient",
    }
    assert Job.objects.filter(state="Running").count() >= 8
    assert Rollout.objects.filter(state__in=["Pending", "Running"]).count() == 1
    assert DriftFinding.objects.filter(resolved_at__isnull=True).count() == 0  # drift shows at the next sweep
    protected = {c.name: cluster_protection(cluster=c).protected for c in Cluster.objects.all()}
    assert protected == {"use-h100-a": False, "use-h200-b": True, "euw-h100-c": False, "euw-h200-d": True}
    nimbus_jobs = Job.objects.filter(tenant__slug="nimbus")
    assert nimbus_jobs.filter(cluster__name="use-h200-b").exists()
    assert not Job.objects.filter(cluster__name="use-h200-b", tenant__slug="acme").exists()


def test_world_is_built_once():
    world_build(seed=7, nodes_per_cluster=8, spares=2)
    again = world_build(seed=7, nodes_per_cluster=8, spares=2)
    assert not again.created and SimWorld.objects.count() == 1 and Cluster.objects.count() == 4
