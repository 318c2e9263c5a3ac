"""The demo world: tenants, fleets, clusters of H100 and H200 nodes with rails, leaf and spine switches and
racks, blueprints with a few versions, a rollout in progress, a drifted cluster and running jobs.

Built once (``world_build`` does nothing when a world exists) through Lockstep's own services, as an
operator would through the API, so the demo exercises the real code paths.
"""

import random
import secrets
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from controlplane.access import Role
from fleet.choices import DriftMode, NodeState
from fleet.desired import desired_state
from fleet.drivers.simulated import set_recovery_failure_probability, simulate_drift
from fleet.models import GPU, NIC, Blueprint, BlueprintVersion, Cluster, Fleet, Node, SimulatedAddon
from fleet.services.blueprints import blueprint_create, version_create
from fleet.services.clusters import cluster_create, fleet_create
from fleet.services.drift import drift_sweep
from fleet.services.rollouts import rollout_start
from jobs.services.jobs import job_submit
from simulator.models import SimWorld
from telemetry.services.tokens import agent_token_create
from tenancy.models import Membership, Tenant
from tenancy.services import tenant_create, token_create, user_create

User = get_user_model()
SERVICE_USER = "lockstep-simulator"

BASE_ADDONS = [
    {
        "name": "gpu-operator",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
        "chart": "gpu-operator",
        "version": "24.6.2",
        "namespace": "gpu-operator",
        "values": {"driver": {"enabled": True}},
    },
    {
        "name": "network-operator",
        "repo": "https://helm.ngc.nvidia.com/nvidia",
        "chart": "network-operator",
        "version": "24.7.0",
        "namespace": "network-operator",
        "values": {"rdma": True},
    },
    {
        "name": "dcgm-exporter",
        "repo": "https://nvidia.github.io/dcgm-exporter/helm-charts",
        "chart": "dcgm-exporter",
        "version": "3.3.7",
        "namespace": "monitoring",
        "values": {"interval": 10},
    },
    {
        "name": "node-feature-discovery",
        "repo": "https://kubernetes-sigs.github.io/node-feature-discovery/charts",
        "chart": "node-feature-discovery",
        "version": "0.16.4",
        "namespace": "nfd",
        "values": {},
    },
]
PROTECTION_ADDONS = [
    {
        "name": "nic-failover",
        "repo": "oci://registry.lockstep.example/charts",
        "chart": "nic-failover",
        "version": "1.2.0",
        "namespace": "lockstep-system",
        "values": {"rails": 8},
    },
    {
        "name": "live-migration",
        "repo": "oci://registry.lockstep.example/charts",
        "chart": "live-migration",
        "version": "1.2.0",
        "namespace": "lockstep-system",
        "values": {"max_pause_seconds": 60},
    },
]
NODE_SOFTWARE = {
    "gpu_driver": "550.90.07",
    "cuda": "12.4",
    "nccl": "2.21.5",
    "nccl_net_plugin": "1.9.0",
    "nic_firmware": "28.39.1002",
}

# name, fleet, GPU model, dedicated tenant (slug or None), blueprint, version
CLUSTERS = [
    ("use-h100-a", "us-east", "H100", None, "gpu-base", 1),
    ("use-h200-b", "us-east", "H200", "nimbus", "gpu-resilient", 2),
    ("euw-h100-c", "eu-west", "H100", "acme", "gpu-base", 1),
    ("euw-h200-d", "eu-west", "H200", None, "gpu-resilient", 2),
]
# The share of recovery operations that fail on the clusters of the live demo (``simulate run``), so job pages
# show a recovery falling back to the next one; a world that is only built (``simulate world``) has none.
DEMO_RECOVERY_FAILURE_PROBABILITY = 0.05


@dataclass
class BuiltWorld:
    world: SimWorld
    created: bool
    passwords: dict = field(default_factory=dict)


def _service_user():
    user = User.objects.filter(username=SERVICE_USER).first()
    if user is None:
        user = User.objects.create_user(username=SERVICE_USER, password=secrets.token_urlsafe(24))
        Membership.objects.create(user=user, role=Role.PROVIDER_ADMIN)
    return user


def _hardware(cluster: Cluster, gpu_model: str, nodes: int, spares: int) -> None:
    """Nodes of 8 GPUs and 8 rail NICs; 16 nodes per leaf switch, 8 per rack, two spines."""
    rows = []
    for i in range(nodes + spares):
        rows.append(
            Node(
                cluster=cluster,
                hostname=f"{cluster.name}-n{i:03d}",
                gpu_model=gpu_model,
                rack=f"{cluster.name}-rack{i // 8:02d}",
                leaf_switch=f"{cluster.name}-leaf{i // 16:02d}",
                spine_switch=f"{cluster.name}-spine{i % 2}",
                state=NodeState.SPARE if i >= nodes else NodeState.READY,
            )
        )
    Node.objects.bulk_create(rows)
    created = list(Node.objects.filter(cluster=cluster).order_by("hostname"))
    GPU.objects.bulk_create(
        [
            GPU(node=n, index=g, uuid=f"GPU-{cluster.name}-{n.hostname}-{g}", model=gpu_model)
            for n in created
            for g in range(8)
        ]
    )
    NIC.objects.bulk_create(
        [
            NIC(node=n, name=f"mlx5_{r}", rail=r, switch_port=f"{n.leaf_switch}/rail{r}/p{idx % 16:02d}")
            for idx, n in enumerate(created)
            for r in range(8)
        ]
    )


def _install(cluster: Cluster) -> None:
    """Put the cluster's blueprint version on the fake cluster, as if installed long ago."""
    now = timezone.now()
    SimulatedAddon.objects.bulk_create(
        [
            SimulatedAddon(
                cluster=cluster,
                name=name,
                chart=spec["chart"],
                version=spec["version"],
                namespace=spec.get("namespace", ""),
                values=spec.get("values") or {},
                ready_at=now,
            )
            for name, spec in desired_state(cluster.blueprint_version).items()
        ]
    )


def _tenants(actor) -> tuple[dict[str, Tenant], dict[str, str]]:
    """The two demo tenants by slug, each with an admin and a viewer; returns them and the users' passwords."""
    passwords = {}
    tenants = {
        "acme": tenant_create(actor=actor, name="Acme Research", slug="acme", tier="standard"),
        "nimbus": tenant_create(actor=actor, name="Nimbus AI", slug="nimbus", tier="resilient"),
    }
    for slug, tenant in tenants.items():
        for role in (Role.TENANT_ADMIN, Role.TENANT_VIEWER):
            username = f"{slug}-{role.split('-')[1]}"
            _, password = user_create(actor=actor, username=username, role=role, tenant=tenant)
            passwords[username] = password
    return tenants, passwords


def _base_blueprint(actor) -> tuple[Blueprint, BlueprintVersion]:
    """The gpu-base blueprint with its golden version and a newer one (gpu-operator 24.9.0), both activated;
    returns the blueprint and its newer version, the one the demo rollout moves to."""
    base = blueprint_create(
        actor=actor,
        name="gpu-base",
        description="GPU operator, networking, monitoring",
        auto_rollout=False,
        drift_mode=DriftMode.NOTIFY,
    )
    version_create(
        actor=actor,
        blueprint=base,
        addons=BASE_ADDONS,
        node_software=NODE_SOFTWARE,
        policy={"protection": {"nic_failover": False, "live_migration": False}},
        notes="golden base",
        activate=True,
    )
    newer = [dict(a, version="24.9.0") if a["name"] == "gpu-operator" else a for a in BASE_ADDONS]
    base_v2 = version_create(
        actor=actor,
        blueprint=base,
        addons=newer,
        node_software=NODE_SOFTWARE,
        policy={"protection": {"nic_failover": False, "live_migration": False}},
        notes="gpu-operator 24.9.0",
        activate=True,
    )
    return base, base_v2


def _resilient_blueprint(actor) -> Blueprint:
    """The gpu-resilient blueprint (gpu-base plus NIC failover and live migration) with two activated versions."""
    resilient = blueprint_create(
        actor=actor,
        name="gpu-resilient",
        description="gpu-base plus NIC failover and live migration",
        auto_rollout=False,
        drift_mode=DriftMode.NOTIFY,
    )
    policy = {"protection": {"nic_failover": True, "live_migration": True}, "risk_threshold": 0.8}
    version_create(
        actor=actor,
        blueprint=resilient,
        addons=BASE_ADDONS + PROTECTION_ADDONS,
        node_software=NODE_SOFTWARE,
        policy=policy,
        notes="protection on",
        activate=True,
    )
    protection_v2 = [
        dict(a, version="1.3.0") if a["name"] == "nic-failover" else a for a in PROTECTION_ADDONS
    ]
    version_create(
        actor=actor,
        blueprint=resilient,
        addons=BASE_ADDONS + protection_v2,
        node_software=NODE_SOFTWARE,
        policy=policy,
        notes="nic-failover 1.3.0",
        activate=True,
    )
    return resilient


def _clusters(
    *,
    actor,
    fleets: dict[str, Fleet],
    tenants: dict[str, Tenant],
    blueprints: dict[str, Blueprint],
    nodes_per_cluster: int,
    spares: int,
) -> list[Cluster]:
    """The CLUSTERS, each on its blueprint version, with its hardware and that version installed."""
    clusters = []
    for name, fleet, model, tenant_slug, blueprint, number in CLUSTERS:
        cluster = cluster_create(
            actor=actor,
            fleet=fleets[fleet],
            name=name,
            region=fleet,
            kind="kubernetes",
            driver="simulated",
            dedicated_tenant=tenants[tenant_slug] if tenant_slug else None,
            labels={"gpu": model.lower(), "region": fleet},
            connection={"apply_seconds": 20, "nic_failover_seconds": 1, "migration_pause_seconds": 30},
        )
        version = blueprints[blueprint].versions.get(number=number)
        Cluster.objects.filter(pk=cluster.pk).update(
            blueprint=blueprints[blueprint], blueprint_version=version
        )
        cluster.refresh_from_db()
        _hardware(cluster, model, nodes_per_cluster, spares)
        _install(cluster)
        clusters.append(cluster)
    return clusters


def _jobs(
    *,
    actor,
    tenants: dict[str, Tenant],
    clusters: list[Cluster],
    nodes_per_cluster: int,
    rng: random.Random,
) -> None:
    """Running jobs of several sizes on every cluster, for the tenants that may use it, leaving spare room."""
    numbers: dict[str, int] = {}  # per tenant: the same job name must not appear on several clusters
    for cluster in clusters:
        owners = [t for t in tenants.values() if cluster.dedicated_tenant_id in (None, t.pk)]
        free = nodes_per_cluster
        for index, size in enumerate((128, 96, 64, 64, 32, 32, 16)):
            if size // 8 > free - 4:
                continue
            tenant = owners[index % len(owners)]
            numbers[tenant.slug] = numbers.get(tenant.slug, 0) + 1
            job_submit(
                actor=actor,
                tenant=tenant,
                cluster=cluster,
                name=f"{tenant.slug}-{['llm', 'moe', 'vision', 'rl'][index % 4]}-{numbers[tenant.slug]}",
                gpus=size,
                seconds_per_iteration=round(rng.uniform(1.5, 6.0), 2),
                checkpoint_interval=rng.choice([300, 500, 1000]),
                total_iterations=10_000_000,
            )
            free -= size // 8


def _agent_tokens(*, actor, clusters: list[Cluster]) -> dict[str, str]:
    """A new agent token for each cluster's simulated agents; returns the raw tokens by cluster name."""
    tokens = {}
    for cluster in clusters:
        _, raw = agent_token_create(actor=actor, cluster=cluster, name="simulated agents")
        tokens[cluster.name] = raw
    return tokens


def world_build(*, seed: int = 7, nodes_per_cluster: int = 64, spares: int = 8) -> BuiltWorld:
    """Build the demo world if there is none. Returns it, whether it was created, and new users' passwords."""
    existing = SimWorld.objects.first()
    if existing is not None:
        return BuiltWorld(existing, created=False)
    rng = random.Random(seed)
    with transaction.atomic():
        actor = _service_user()
        tenants, passwords = _tenants(actor)
        fleets = {
            name: fleet_create(actor=actor, name=name, description=f"{name} region")
            for name in ("us-east", "eu-west")
        }
        base, base_v2 = _base_blueprint(actor)
        resilient = _resilient_blueprint(actor)
        clusters = _clusters(
            actor=actor,
            fleets=fleets,
            tenants=tenants,
            blueprints={"gpu-base": base, "gpu-resilient": resilient},
            nodes_per_cluster=nodes_per_cluster,
            spares=spares,
        )
        drift_sweep(cluster_ids=[c.pk for c in clusters])
        simulate_drift(Cluster.objects.get(name="euw-h200-d"), addon="dcgm-exporter", kind="values")
        _jobs(actor=actor, tenants=tenants, clusters=clusters, nodes_per_cluster=nodes_per_cluster, rng=rng)
        tokens = _agent_tokens(actor=actor, clusters=clusters)
        _, api_token = token_create(actor=actor, owner=actor, name="simulator", scope="write")
        world = SimWorld.objects.create(seed=seed, agent_tokens=tokens, api_token=api_token)
    # The rollout starts after the world is committed: its first batch runs on the beat-driven step.
    rollout_start(
        actor=actor,
        version=base_v2,
        targets={"clusters": [c.pk for c in clusters if c.blueprint_id == base.pk]},
        strategy={"batch_size": 1, "soak_seconds": 600, "progress_deadline_seconds": 900},
    )
    return BuiltWorld(world, created=True, passwords=passwords)


def world_set_recovery_failures(*, probability: float) -> list[str]:
    """Make the share ``probability`` of recovery operations fail on the demo world's clusters; returns their
    names."""
    clusters = list(
        Cluster.objects.filter(name__in=[name for name, *_ in CLUSTERS], driver="simulated").order_by("pk")
    )
    for cluster in clusters:
        set_recovery_failure_probability(cluster, probability=probability)
    return [cluster.name for cluster in clusters]


def world_tenant_users() -> list[str]:
    return list(
        User.objects.filter(membership__tenant__in=Tenant.objects.all()).values_list("username", flat=True)
    )
