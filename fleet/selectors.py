"""Reads of the fleet app, each scoped to the user it reads for."""

from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet

from controlplane.access import principal, require
from controlplane.prepared import PreparedQuery
from fleet.choices import DriverName, GPUHealth, HealthStatus, NodeState, SyncStatus
from fleet.models import (
    GPU,
    NIC,
    Blueprint,
    BlueprintVersion,
    Cluster,
    DriftFinding,
    Fleet,
    Node,
    ObservedAddon,
    Rollout,
    RolloutCluster,
)
from fleet.models.blueprints import PROTECTION_ADDONS
from tenancy.scoping import may_see, restrict, sees


@dataclass(frozen=True)
class ProtectionVerdict:
    protected: bool
    reason: str


def cluster_protection(*, cluster: Cluster, observed: list[ObservedAddon] | None = None) -> ProtectionVerdict:
    """Is a job on this cluster protected? DESIGN: the policy turns protection on *and* the protection
    add-ons are observed InSync and Healthy. The reason says what is missing when not."""
    version = cluster.blueprint_version
    if version is None:
        return ProtectionVerdict(False, "the cluster carries no blueprint version")
    enabled = version.protection_enabled()
    if not all(enabled.values()):
        off = ", ".join(key.replace("_", " ") for key, on in enabled.items() if not on)
        return ProtectionVerdict(False, f"blueprint {version} does not turn on {off}")
    if observed is None:
        observed = list(ObservedAddon.objects.filter(cluster=cluster, name__in=PROTECTION_ADDONS.values()))
    by_name = {row.name: row for row in observed}
    for addon in PROTECTION_ADDONS.values():
        row = by_name.get(addon)
        if row is None:
            return ProtectionVerdict(False, f"add-on {addon} is not observed on the cluster")
        if row.sync != SyncStatus.IN_SYNC or row.health != HealthStatus.HEALTHY:
            return ProtectionVerdict(False, f"add-on {addon} is {row.sync}/{row.health}, not InSync/Healthy")
    return ProtectionVerdict(True, "protection add-ons are InSync and Healthy")


def may_see_cluster_topic(who, cluster_id: int) -> bool:
    """Provider roles see every cluster topic; a tenant sees the topics of its dedicated clusters only."""
    return may_see(who, Cluster, cluster_id)


def cluster_list(*, user) -> QuerySet[Cluster]:
    """Clusters the user sees in full: all for provider roles, a tenant's dedicated clusters for its users."""
    return restrict(Cluster.objects.select_related("fleet", "blueprint_version__blueprint"), user)


def node_list(*, user) -> QuerySet[Node]:
    return restrict(Node.objects.select_related("cluster"), user)


def _nodes_named(who, *, node=None, hostname=None, cluster=None, cluster_name=None) -> QuerySet:
    nodes = node_list(user=who)
    if node is not None:
        nodes = nodes.filter(pk=node)
    if hostname is not None:
        nodes = nodes.filter(hostname=hostname)
    if cluster is not None:
        nodes = nodes.filter(cluster_id=cluster)
    if cluster_name is not None:
        nodes = nodes.filter(cluster__name=cluster_name)
    return nodes.values_list(
        "id", "hostname", "rack", "cluster_id", "cluster__name", "cluster__dedicated_tenant_id"
    )[:2]


# A fault report names its node: the hot read of intake, compiled once per user (its scope) and way of naming.
_NODES_NAMED = PreparedQuery(_nodes_named, node=int, hostname=str, cluster=int, cluster_name=str)


def nodes_named(
    *,
    user,
    node: int | None = None,
    hostname: str | None = None,
    cluster: int | None = None,
    cluster_name: str | None = None,
) -> list[Node]:
    """At most two of the nodes the user sees with this id or hostname (on this cluster, by id or name): two say
    the name is ambiguous. Each has its id, hostname, rack and cluster loaded, and its cluster its id, name and
    dedicated tenant (the fields fault intake reads); any other field loads when read, as with ``only()``."""
    found = []
    for node_id, name, rack, cluster_id, cluster_name_, tenant_id in _NODES_NAMED.rows(
        principal(user), node=node, hostname=hostname, cluster=cluster, cluster_name=cluster_name
    ):
        row = Node.from_db(
            "default", *_loaded(Node, id=node_id, hostname=name, rack=rack, cluster_id=cluster_id)
        )
        row.cluster = Cluster.from_db(
            "default", *_loaded(Cluster, id=cluster_id, name=cluster_name_, dedicated_tenant_id=tenant_id)
        )
        found.append(row)
    return found


def _loaded(model, **values) -> tuple[list[str], list]:
    """``from_db``'s field names and values for these columns, in the model's order (which it reads them in)."""
    fields = [field.attname for field in model._meta.concrete_fields if field.attname in values]
    return fields, [values[name] for name in fields]


def node_hardware(*, user, node: Node) -> dict[str, list]:
    """A node's GPUs (by index) and NICs (by rail), as the user may see them."""
    return {
        "gpus": list(restrict(GPU.objects.filter(node=node), user).order_by("index")),
        "nics": list(restrict(NIC.objects.filter(node=node), user).order_by("rail", "name")),
    }


def fleet_list(*, user) -> QuerySet:
    """All fleets for provider roles; for tenant users, the fleets that hold one of their dedicated clusters."""
    return restrict(
        Fleet.objects.all(), user, also=Q(pk__in=restrict(Cluster.objects.all(), user).values("fleet_id"))
    )


def cluster_catalog(*, user) -> QuerySet[Cluster]:
    """Clusters the user may know of: ``cluster_list`` plus, for tenant users, shared clusters (of which they
    are shown only name, tier and blueprint version)."""
    return restrict(
        Cluster.objects.select_related("fleet", "blueprint_version__blueprint"),
        user,
        also=Q(dedicated_tenant__isnull=True),
    )


def sees_in_full(user, cluster: Cluster) -> bool:
    return sees(user, cluster)


def blueprint_list(*, user) -> QuerySet:
    """Blueprints and versions are for provider roles (DESIGN); PermissionDenied for anyone else."""
    _provider_only(user, "blueprints")
    return Blueprint.objects.all()


def rollout_list(*, user) -> QuerySet:

    _provider_only(user, "rollouts")
    return Rollout.objects.select_related("version__blueprint")


def rollout_detail(*, user, pk: int):
    """One rollout with its batches and clusters loaded (what its API body shows)."""
    return (
        rollout_list(user=user)
        .prefetch_related("batches", "clusters__cluster", "clusters__previous_version")
        .get(pk=pk)
    )


def blueprint_rollouts(*, user, blueprint) -> QuerySet:
    """A blueprint's rollouts (provider roles, as ``rollout_list``)."""
    return rollout_list(user=user).filter(version__blueprint=blueprint)


def blueprint_versions(*, user, ids) -> QuerySet:
    """These blueprint versions, each with its blueprint (provider roles, as ``blueprint_list``)."""
    _provider_only(user, "blueprints")
    return BlueprintVersion.objects.filter(pk__in=ids).select_related("blueprint")


def blueprint_version(*, user, blueprint_id: int, number: int):
    """One version of a blueprint by its number, or None (provider roles, as ``blueprint_list``)."""
    _provider_only(user, "blueprints")
    return BlueprintVersion.objects.filter(blueprint_id=blueprint_id, number=number).first()


def tracking_clusters(*, user, blueprint) -> QuerySet[Cluster]:
    """The clusters the user sees that track a blueprint's latest version."""
    return restrict(Cluster.objects.filter(blueprint=blueprint, track_latest=True), user)


def observed_addons(*, user, cluster: Cluster) -> QuerySet[ObservedAddon]:
    """The add-ons observed on a cluster."""
    return restrict(ObservedAddon.objects.filter(cluster=cluster), user)


def cluster_drift(*, user, cluster: Cluster) -> list:
    """A cluster's open drift findings and its last ten resolved ones, open first, newest detected first."""
    findings = restrict(cluster.drift_findings.all(), user)
    return list(
        findings.filter(
            Q(resolved_at__isnull=True)
            | Q(pk__in=findings.filter(resolved_at__isnull=False).order_by("-resolved_at").values("pk")[:10])
        ).order_by("resolved_at", "-detected_at")
    )


def cluster_rollouts(*, user, cluster: Cluster) -> QuerySet:
    """The rollouts that took a cluster in (its ``RolloutCluster`` rows), newest first."""
    return restrict(cluster.rollout_entries.select_related("rollout__version__blueprint"), user).order_by(
        "-rollout_id"
    )


def cluster_ladders(*, user, cluster: Cluster) -> QuerySet[Node]:
    """A cluster's nodes on the escalation ladder (the jobs app's row, reached through the relation): where
    each stands and what its validation saw (the health check through the driver, clean telemetry after it)."""
    return (
        restrict(cluster.nodes.filter(escalation__isnull=False), user)
        .exclude(escalation__stage="watching")
        .select_related("escalation")
        .order_by("-escalation__updated_at")
    )


def open_drift_counts(*, user, cluster_ids) -> dict[int, int]:
    """The open drift findings of each of these clusters (those with none left out)."""
    return dict(
        restrict(DriftFinding.objects.filter(cluster_id__in=cluster_ids, resolved_at__isnull=True), user)
        .values_list("cluster_id")
        .annotate(n=Count("id"))
        .order_by()
    )


def drift_list(*, user) -> QuerySet:
    """Drift findings of the clusters the user sees in full."""
    return restrict(DriftFinding.objects.select_related("cluster"), user)


def drift_resolution_labels(findings) -> dict[int, str]:
    """How each resolved finding ended, for people: a finding stored as converged (no correction was attempted)
    that a rollout resolved — the cluster got a version applied between the finding's detection and its
    resolution — reads "Fixed by rollout #N", not "Went away by itself". One query for the findings given, which
    the caller has already scoped to the reader."""
    findings = [f for f in findings if f.resolved_at is not None]
    labels = {f.pk: f.get_resolution_display() for f in findings}
    converged = [f for f in findings if f.resolution == DriftFinding.Resolution.CONVERGED]
    if not converged:
        return labels
    applied: dict[int, list] = {}
    rows = (
        RolloutCluster.objects.filter(
            cluster_id__in={f.cluster_id for f in converged},
            applied_at__isnull=False,
            applied_at__gte=min(f.detected_at for f in converged),
            applied_at__lte=max(f.resolved_at for f in converged),
        )
        .values_list("cluster_id", "rollout_id", "applied_at")
        .order_by("applied_at")
    )
    for cluster_id, rollout_id, at in rows:
        applied.setdefault(cluster_id, []).append((rollout_id, at))
    for finding in converged:
        by = [
            rollout
            for rollout, at in applied.get(finding.cluster_id, [])
            if finding.detected_at <= at <= finding.resolved_at
        ]
        if by:
            labels[finding.pk] = f"Fixed by rollout #{by[-1]}"
    return labels


def _provider_only(user, what: str) -> None:
    require(principal(user).is_provider, f"{what} are for provider roles")


# The landing pages' reads (home/views.py): the provider's fleet dashboard and a tenant's clusters.


def dashboard_clusters(*, user) -> list[Cluster]:
    """Every cluster the user sees in full, by fleet and name, with what the dashboard's rows name."""
    return list(
        restrict(
            Cluster.objects.select_related("fleet", "blueprint_version__blueprint", "dedicated_tenant"), user
        ).order_by("fleet__name", "name")
    )


def fleet_capacity(*, user) -> dict[str, int]:
    """GPUs (all, and healthy on nodes that have not failed) and nodes (all, spare, out of service or failed)."""
    # A GPU of a failed node serves nothing, whatever its own last health was.
    gpus = restrict(GPU.objects.all(), user).aggregate(
        total=Count("id"),
        healthy=Count("id", filter=Q(health=GPUHealth.HEALTHY) & ~Q(node__state=NodeState.FAILED)),
    )
    nodes = restrict(Node.objects.all(), user).aggregate(
        total=Count("id"),
        spare=Count("id", filter=Q(state=NodeState.SPARE)),
        out=Count("id", filter=Q(state__in=[NodeState.CORDONED, NodeState.DRAINING, NodeState.FAILED])),
    )
    return {
        "gpus": gpus["total"],
        "gpus_healthy": gpus["healthy"],
        "nodes": nodes["total"],
        "spare_nodes": nodes["spare"],
        "nodes_out": nodes["out"],
    }


def node_heatmaps(*, user, cluster_ids: list[int]) -> dict[int, dict]:
    """Per cluster, its nodes in hostname order with their ids, GPU counts, count of GPUs that are not healthy
    (-1 for a failed node) and their state: one aggregate query for the whole fleet. The page keys its cells by
    node id, so the node events of the fleet topic turn them."""
    rows = (
        restrict(Node.objects.filter(cluster_id__in=cluster_ids), user)
        .annotate(unhealthy=Count("gpus", filter=~Q(gpus__health=GPUHealth.HEALTHY)), gpu_count=Count("gpus"))
        .values_list("cluster_id", "pk", "hostname", "rack", "state", "unhealthy", "gpu_count")
        .order_by("cluster_id", "hostname")
    )
    maps: dict[int, dict] = {
        cid: {"ids": [], "hosts": [], "racks": [], "states": [], "unhealthy": [], "gpus": []}
        for cid in cluster_ids
    }
    for cluster_id, pk, hostname, rack, state, unhealthy, gpu_count in rows:
        entry = maps[cluster_id]
        entry["ids"].append(pk)
        entry["gpus"].append(gpu_count)
        entry["hosts"].append(hostname)
        entry["racks"].append(rack)
        entry["states"].append(state)
        entry["unhealthy"].append(-1 if state == NodeState.FAILED else unhealthy)
    return maps


def dedicated_clusters(*, user, tenant_id: int) -> QuerySet[Cluster]:
    """The clusters dedicated to a tenant, as the user sees them."""
    return restrict(
        Cluster.objects.filter(dedicated_tenant_id=tenant_id).select_related("blueprint_version__blueprint"),
        user,
    )


def job_clusters(*, user, tenant_id: int) -> QuerySet[Cluster]:
    """The clusters this user may submit or register a job of the tenant on: for provider roles every cluster not
    dedicated to another tenant; for a tenant's users its own and the shared clusters Lockstep places jobs on (the
    simulated ones: a real shared cluster's jobs are registered by its launcher). Any other id, whether it names
    another tenant's cluster or none, is answered the same (issue 54: no existence oracle)."""
    clusters = cluster_catalog(user=user).filter(
        Q(dedicated_tenant_id=tenant_id) | Q(dedicated_tenant__isnull=True)
    )
    if not principal(user).is_provider:
        clusters = clusters.filter(Q(dedicated_tenant_id=tenant_id) | Q(driver=DriverName.SIMULATED))
    return clusters


def submit_clusters(*, user, tenant_id: int) -> list[Cluster]:
    """The simulated clusters a tenant's job may be submitted to from its home: its own and the shared ones."""
    return list(
        job_clusters(user=user, tenant_id=tenant_id).filter(driver=DriverName.SIMULATED).order_by("name")
    )
