"""The landing pages: the provider's fleet dashboard and a tenant's self-service view.

Every figure is computed from the database with a fixed number of queries whatever the fleet's size (the GPU
health heat map is one aggregate per node, sent as data and drawn by Plotly, not templated cells); the page
then applies live events from its topic.
"""

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncDay, TruncHour, TruncMinute
from django.shortcuts import redirect, render
from django.utils import timezone

from controlplane.access import principal
from controlplane.errors import ServiceError
from controlplane.selectors import event_history, topic_seq
from controlplane.timerange import TimeRange, time_range
from fleet.choices import GPUHealth, NodeState
from fleet.models import GPU, Cluster, Node
from fleet.selectors import cluster_protection
from fleet.status import cluster_status
from jobs.choices import ActionState, JobPhaseKind, JobState, SavingState
from jobs.models import FaultEvent, Job, JobPhase, RecoveryAction
from jobs.services.jobs import job_submit
from tenancy.models import Membership, Tenant


def _saved_since(actions, since) -> float:
    value = actions.filter(state=ActionState.SUCCEEDED, dry_run=False, ended_at__gte=since).aggregate(s=Sum("gpu_hours_saved"))["s"]
    return round(value or 0.0, 2)


def expected_saving(actions) -> float:
    """What unsettled proactive moves expect to save (kept apart from the realized figure; docs/gpu-hours.md)."""
    value = (actions.filter(state=ActionState.SUCCEEDED, dry_run=False, saving=SavingState.EXPECTED)
             .aggregate(s=Sum("gpu_hours_expected"))["s"])
    return round(value or 0.0, 2)


def heatmap(cluster_ids: list[int]) -> dict[int, dict]:
    """Per cluster, its nodes in hostname order with their ids, GPU counts, count of GPUs that are not healthy
    (-1 for a failed node) and their state: one aggregate query for the whole fleet. The page keys its cells by
    node id, so the node events of the fleet topic turn them."""
    rows = (Node.objects.filter(cluster_id__in=cluster_ids)
            .annotate(unhealthy=Count("gpus", filter=~Q(gpus__health=GPUHealth.HEALTHY)), gpu_count=Count("gpus"))
            .values_list("cluster_id", "pk", "hostname", "rack", "state", "unhealthy", "gpu_count")
            .order_by("cluster_id", "hostname"))
    maps: dict[int, dict] = {cid: {"ids": [], "hosts": [], "racks": [], "states": [], "unhealthy": [], "gpus": []}
                             for cid in cluster_ids}
    for cluster_id, pk, hostname, rack, state, unhealthy, gpu_count in rows:
        entry = maps[cluster_id]
        entry["ids"].append(pk)
        entry["gpus"].append(gpu_count)
        entry["hosts"].append(hostname)
        entry["racks"].append(rack)
        entry["states"].append(state)
        entry["unhealthy"].append(-1 if state == NodeState.FAILED else unhealthy)
    return maps


TRUNCATE = {"minute": TruncMinute, "hour": TruncHour, "day": TruncDay}


def heatmap_summary(entry: dict) -> str:
    """The heat map of one cluster in words (its text alternative): how many nodes are healthy, and which are
    not, out of service or failed. static/js/home_provider.js rewrites it as node events arrive."""
    out, failed, sick = [], [], []
    for host, state, unhealthy in zip(entry["hosts"], entry["states"], entry["unhealthy"], strict=True):
        if state == NodeState.FAILED:
            failed.append(host)
        elif state in (NodeState.CORDONED, NodeState.DRAINING):
            out.append(host)
        elif unhealthy > 0:
            sick.append(f"{host} ({unhealthy} GPU{'s' if unhealthy != 1 else ''})")
    total = len(entry["hosts"])
    healthy = total - len(out) - len(failed) - len(sick)
    parts = [f"{healthy} of {total} nodes have all GPUs healthy"]
    for label, hosts in (("not all GPUs healthy", sick), ("out of service", out), ("failed", failed)):
        if hosts:
            listed = ", ".join(hosts[:12]) + (f" and {len(hosts) - 12} more" if len(hosts) > 12 else "")
            parts.append(f"{len(hosts)} {label}: {listed}")
    return "; ".join(parts) + "."


def provider_dashboard(window: TimeRange | None = None) -> dict:
    """The fleet dashboard's figures, heat maps and charts; the charts (faults per bucket, GPU-hours saved
    cumulated) cover ``window`` (the last 7 days by default)."""
    now = window.now if window else timezone.now()
    since = window.since if window else now - timedelta(days=7)
    truncate = TRUNCATE[window.bucket if window else "hour"]
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    clusters = list(Cluster.objects.select_related("fleet", "blueprint_version__blueprint", "dedicated_tenant")
                    .order_by("fleet__name", "name"))
    ids = [c.pk for c in clusters]
    status = cluster_status(ids)
    # A GPU of a failed node serves nothing, whatever its own last health was.
    gpus = GPU.objects.aggregate(total=Count("id"), healthy=Count("id", filter=Q(health=GPUHealth.HEALTHY)
                                                                  & ~Q(node__state=NodeState.FAILED)))
    nodes = Node.objects.aggregate(total=Count("id"), spare=Count("id", filter=Q(state=NodeState.SPARE)),
                                   out=Count("id", filter=Q(state__in=[NodeState.CORDONED, NodeState.DRAINING, NodeState.FAILED])))
    day_ago = now - timedelta(hours=24)
    faults = FaultEvent.objects.filter(received_at__gte=day_ago)
    actions = RecoveryAction.objects.all()
    on_version = sum(1 for c in clusters if c.blueprint_version_id and status[c.pk].total
                     and status[c.pk].ready == status[c.pk].total)
    per_hour = (FaultEvent.objects.filter(received_at__gte=since).annotate(hour=truncate("received_at"))
                .values("hour").annotate(n=Count("id")).order_by("hour"))
    saved_hours = (actions.filter(state=ActionState.SUCCEEDED, dry_run=False, ended_at__gte=since)
                   .annotate(hour=truncate("ended_at")).values("hour").annotate(saved=Sum("gpu_hours_saved")).order_by("hour"))
    cumulative, saved_series = 0.0, []
    for row in saved_hours:
        cumulative += row["saved"] or 0.0
        saved_series.append({"t": row["hour"].isoformat(), "v": round(cumulative, 3)})
    maps = heatmap(ids)
    return {
        "figures": {
            "clusters": len(clusters), "nodes": nodes["total"], "spare_nodes": nodes["spare"], "nodes_out": nodes["out"],
            "gpus": gpus["total"], "gpus_healthy": gpus["healthy"],
            "faults_24h": faults.count(), "faults_open": FaultEvent.objects.filter(state="new").count(),
            "compliant": on_version, "with_blueprint": sum(1 for c in clusters if c.blueprint_version_id),
            "saved_today": _saved_since(actions, today), "saved_30d": _saved_since(actions, now - timedelta(days=30)),
            "expected": expected_saving(actions),
        },
        "clusters": [{"id": c.pk, "name": c.name, "fleet": c.fleet.name,
                      "tenant": c.dedicated_tenant.name if c.dedicated_tenant else "shared",
                      "version": str(c.blueprint_version) if c.blueprint_version else "—",
                      "sync": status[c.pk].sync, "health": status[c.pk].health, "ready": status[c.pk].label,
                      "heatmap": maps[c.pk], "summary": heatmap_summary(maps[c.pk])} for c in clusters],
        "charts": {"faults": [{"t": r["hour"].isoformat(), "v": r["n"]} for r in per_hour], "saved": saved_series,
                   "range": window.as_data() if window else None},
    }


def phase_seconds(tenant: Tenant, *, since, now) -> dict[str, float]:
    """Seconds the tenant's jobs spent in each phase kind between ``since`` and ``now``: phases still open count
    up to now, and one that began before ``since`` counts from ``since``. Closed phases inside the window are one
    aggregate; the few that are open or straddle its start (about one per job) are added here."""
    inside = (JobPhase.objects.filter(job__tenant=tenant, started_at__gte=since, ended_at__isnull=False)
              .values("kind").annotate(seconds=Sum(F("ended_at") - F("started_at"))).order_by())
    totals = {row["kind"]: (row["seconds"].total_seconds() if row["seconds"] else 0.0) for row in inside}
    edges = (JobPhase.objects.filter(job__tenant=tenant)
             .filter(Q(ended_at__isnull=True) | Q(started_at__lt=since, ended_at__gt=since))
             .values_list("kind", "started_at", "ended_at"))
    for kind, started_at, ended_at in edges:
        seconds = (min(ended_at or now, now) - max(started_at, since)).total_seconds()
        if seconds > 0:
            totals[kind] = totals.get(kind, 0.0) + seconds
    return totals


def tenant_dashboard(tenant: Tenant) -> dict:
    now = timezone.now()
    jobs = list(Job.objects.filter(tenant=tenant).select_related("cluster__blueprint_version__blueprint")
                .annotate(saved=Sum("actions__gpu_hours_saved", filter=Q(actions__state=ActionState.SUCCEEDED,
                                                                          actions__dry_run=False)))
                .order_by("-created_at")[:100])
    clusters = {job.cluster_id: job.cluster for job in jobs}
    for cluster in Cluster.objects.filter(dedicated_tenant=tenant).select_related("blueprint_version__blueprint"):
        clusters[cluster.pk] = cluster
    durations = phase_seconds(tenant, since=now - timedelta(days=30), now=now)
    open_recovering = JobPhase.objects.filter(job__tenant=tenant, kind=JobPhaseKind.RECOVERING, ended_at__isnull=True).count()
    running, recovering = durations.get(JobPhaseKind.RUNNING, 0.0), durations.get(JobPhaseKind.RECOVERING, 0.0)
    uptime = running / (running + recovering) if running + recovering else None
    saved = (RecoveryAction.objects.filter(job__tenant=tenant, state=ActionState.SUCCEEDED, dry_run=False)
             .aggregate(s=Sum("gpu_hours_saved"))["s"] or 0.0)
    return {
        "jobs": jobs,
        "clusters": [{"cluster": c, "protection": cluster_protection(cluster=c),
                      "dedicated": c.dedicated_tenant_id == tenant.pk} for c in clusters.values()],
        "saved": round(saved, 2), "uptime": uptime,
        "expected": expected_saving(RecoveryAction.objects.filter(job__tenant=tenant)), "recovering_now": open_recovering,
        "running": sum(1 for j in jobs if j.state == JobState.RUNNING),
        "submit_clusters": [c for c in Cluster.objects.filter(Q(dedicated_tenant=tenant) | Q(dedicated_tenant__isnull=True),
                                                               driver="simulated").order_by("name")],
        "users": Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username"),
    }




# The submit form places simulated jobs on nodes of this many GPUs (the service's default).
SUBMIT_GPUS_PER_NODE = 8


def _submit(request, tenant: Tenant) -> str | None:
    """The submit form: validates shape, then the job service decides. Returns an error to show, or None."""
    try:
        cluster = Cluster.objects.get(pk=int(request.POST.get("cluster", "0")))
        gpus = int(request.POST.get("gpus", "0"))
        seconds = float(request.POST.get("seconds_per_iteration") or 2.0)
        interval = int(request.POST.get("checkpoint_interval") or 500)
    except (Cluster.DoesNotExist, ValueError):
        return "Choose a cluster and give whole numbers."
    name = (request.POST.get("name") or "").strip()[:100]
    if not name:
        return "Give the job a name."
    if not 1 <= gpus <= 4096 or interval < 1:
        return "GPUs must be between 1 and 4096, the checkpoint interval at least 1."
    try:
        job_submit(actor=request.user, tenant=tenant, cluster=cluster, name=name, gpus=gpus,
                   gpus_per_node=SUBMIT_GPUS_PER_NODE, seconds_per_iteration=seconds, checkpoint_interval=interval,
                   total_iterations=10_000_000)
    except ServiceError as error:
        if error.status == 409 and error.field == "gpus":
            # The service counts nodes ("needs 63"); the form asked for GPUs, so say it in both.
            nodes = -(-gpus // SUBMIT_GPUS_PER_NODE)
            return (f"{cluster.name} has too few free nodes for {gpus:,} GPUs: they take {nodes:,} free ready "
                    f"nodes of {SUBMIT_GPUS_PER_NODE} GPUs. Ask for fewer GPUs or choose another cluster.")
        return f"{error.field + ': ' if error.field else ''}{error.detail}"
    return None


@login_required
def home(request):
    """The provider's fleet dashboard, or the tenant's own view; a user with no role sees an explanation."""
    who = principal(request.user)
    if who.is_provider:
        after = topic_seq("fleet")   # read before the snapshot: events after it are applied on top
        window = time_range(request)
        data = provider_dashboard(window)
        return render(request, "jobs/home_provider.html", {
            "data": data, "after": after, "who": who, "time_range": window,
            "history": event_history(user=request.user, topic="fleet", up_to=after)})
    if who.tenant_id is None:
        return render(request, "jobs/home_none.html", {"who": who})
    tenant = Tenant.objects.get(pk=who.tenant_id)
    error = None
    if request.method == "POST" and who.may_submit_jobs(tenant.pk):
        error = _submit(request, tenant)
        if error is None:
            return redirect("home")
    topic = f"tenant-{tenant.pk}"
    after = topic_seq(topic)
    # A refused submission shows the form as it was sent, so the reader corrects it instead of retyping it.
    submitted = request.POST if error else {}
    return render(request, "jobs/home_tenant.html", {
        "tenant": tenant, "data": tenant_dashboard(tenant), "who": who, "topic": topic, "after": after,
        "error": error, "submitted": submitted, "history": event_history(user=request.user, topic=topic, up_to=after)})
