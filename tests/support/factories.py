"""factory_boy factories for the rows most tests start from (tenants and users, a small fleet, a blueprint), and the
``make_*`` shortcuts the tests call them through: positional arguments and the names the tests have always used.

Generated names share one counter per area, so two rows a session makes never collide on a unique name.
"""

import copy
import itertools
import uuid

import factory
from django.contrib.auth import get_user_model
from factory.django import DjangoModelFactory

from controlplane.access import Role
from fleet.choices import NodeState
from fleet.models import GPU, NIC, Blueprint, BlueprintVersion, Cluster, Fleet, Node
from tenancy import services
from tenancy.models import Membership, Tenant

_accounts = itertools.count(1)
_fleet = itertools.count(1)

GPU_OPERATOR = {
    "name": "gpu-operator",
    "repo": "https://helm.ngc.nvidia.com/nvidia",
    "chart": "gpu-operator",
    "version": "24.9.0",
    "namespace": "gpu-operator",
    "values": {},
}
PROTECTION_ADDONS = [
    {
        "name": "nic-failover",
        "repo": "oci://registry.example/lockstep",
        "chart": "nic-failover",
        "version": "1.2.0",
        "namespace": "lockstep",
        "values": {},
    },
    {
        "name": "live-migration",
        "repo": "oci://registry.example/lockstep",
        "chart": "live-migration",
        "version": "1.2.0",
        "namespace": "lockstep",
        "values": {},
    },
]


# --- tenants and users ----------------------------------------------------------------------------------------


class TenantFactory(DjangoModelFactory):
    class Meta:
        model = Tenant

    class Params:
        number = factory.LazyFunction(lambda: next(_accounts))

    name = factory.LazyAttribute(lambda tenant: f"tenant-{tenant.number}")
    slug = factory.LazyAttribute(lambda tenant: f"{tenant.name.lower().replace(' ', '-')}-{tenant.number}")


class MembershipFactory(DjangoModelFactory):
    class Meta:
        model = Membership


class UserFactory(DjangoModelFactory):
    """A user with a password and a membership: ``role`` (provider roles without a tenant, tenant roles with one)."""

    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    class Params:
        role = Role.OPERATOR
        tenant = None

    username = factory.LazyAttribute(lambda user: f"{user.role}-{next(_accounts)}")
    password = "correct-horse-9"
    membership = factory.RelatedFactory(
        MembershipFactory,
        factory_related_name="user",
        tenant=factory.SelfAttribute("..tenant"),
        role=factory.SelfAttribute("..role"),
    )

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        return cls._get_manager(model_class).create_user(*args, **kwargs)


def make_tenant(name: str | None = None, **fields) -> Tenant:
    return TenantFactory(**({"name": name} if name else {}), **fields)


def make_user(
    role: str, tenant: Tenant | None = None, username: str | None = None, password: str = "correct-horse-9"
):
    return UserFactory(
        role=role, tenant=tenant, password=password, **({"username": username} if username else {})
    )


def token_header(user, scope: str = "write", **kwargs) -> dict:
    """Request headers that authenticate as ``user`` with a real API token (made by the token service)."""
    _, raw = services.token_create(actor=user, owner=user, name=f"t{next(_accounts)}", scope=scope, **kwargs)
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


# --- a small fleet ------------------------------------------------------------------------------------------------


class FleetFactory(DjangoModelFactory):
    class Meta:
        model = Fleet

    name = factory.LazyFunction(lambda: f"fleet-{next(_fleet)}")
    # Test fleets hold a handful of nodes, where the share circuit breaker's default (20 %, at least one node)
    # would refuse a second cordon; it is off here unless a test sets it (tests/fleet/test_node_services.py).
    max_disrupted_percent = 100


class ClusterFactory(DjangoModelFactory):
    class Meta:
        model = Cluster

    fleet = factory.SubFactory(FleetFactory)
    name = factory.LazyFunction(lambda: f"cluster-{next(_fleet)}")


class NodeFactory(DjangoModelFactory):
    """A node with ``gpus`` GPUs and ``nics`` NICs (one rail each, on ports of its leaf switch)."""

    class Meta:
        model = Node
        skip_postgeneration_save = True

    cluster = factory.SubFactory(ClusterFactory)
    hostname = factory.LazyFunction(lambda: f"node-{next(_fleet)}")
    gpu_model = "H100"
    leaf_switch = "leaf-1"
    rack = "rack-1"
    spine_switch = "spine-1"
    state = NodeState.READY

    @factory.post_generation
    def gpus(node, create, count, **kwargs):
        if not create:
            return
        count = 8 if count is None else count
        GPU.objects.bulk_create(
            [GPU(node=node, index=i, uuid=f"GPU-{uuid.uuid4()}", model=node.gpu_model) for i in range(count)]
        )

    @factory.post_generation
    def nics(node, create, count, **kwargs):
        if not create:
            return
        count = 8 if count is None else count
        NIC.objects.bulk_create(
            [
                NIC(node=node, name=f"mlx5_{i}", rail=i, switch_port=f"{node.leaf_switch}/p{i}")
                for i in range(count)
            ]
        )


class BlueprintFactory(DjangoModelFactory):
    class Meta:
        model = Blueprint

    name = factory.LazyFunction(lambda: f"bp-{next(_fleet)}")


class BlueprintVersionFactory(DjangoModelFactory):
    """An active first version: the GPU operator, and with ``protection`` the protection add-ons and policy."""

    class Meta:
        model = BlueprintVersion

    class Params:
        protection = False

    blueprint = factory.SubFactory(BlueprintFactory)
    number = 1
    state = "active"
    addons = factory.LazyAttribute(
        lambda version: copy.deepcopy([GPU_OPERATOR, *(PROTECTION_ADDONS if version.protection else [])])
    )
    policy = factory.LazyAttribute(
        lambda version: {
            "protection": {"nic_failover": version.protection, "live_migration": version.protection}
        }
    )


def make_fleet(name: str | None = None, **fields) -> Fleet:
    return FleetFactory(**({"name": name} if name else {}), **fields)


def make_cluster(fleet: Fleet | None = None, name: str | None = None, **fields) -> Cluster:
    return ClusterFactory(**({"fleet": fleet} if fleet else {}), **({"name": name} if name else {}), **fields)


def make_node(
    cluster: Cluster,
    hostname: str | None = None,
    *,
    gpus: int = 8,
    nics: int = 8,
    gpu_model: str = "H100",
    leaf: str = "leaf-1",
    rack: str = "rack-1",
    state: str = NodeState.READY,
) -> Node:
    return NodeFactory(
        cluster=cluster,
        **({"hostname": hostname} if hostname else {}),
        gpus=gpus,
        nics=nics,
        gpu_model=gpu_model,
        leaf_switch=leaf,
        rack=rack,
        state=state,
    )


def make_blueprint(
    name: str | None = None, *, protection: bool = False, **fields
) -> tuple[Blueprint, BlueprintVersion]:
    blueprint = BlueprintFactory(**({"name": name} if name else {}), **fields)
    return blueprint, BlueprintVersionFactory(blueprint=blueprint, protection=protection)
