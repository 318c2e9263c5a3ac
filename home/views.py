"""The landing pages: the provider's fleet dashboard and a tenant's self-service view.

Every figure is read through the selectors of the area it belongs to (fleet, jobs, tenancy) with a fixed number
of queries whatever the fleet's size (the GPU health heat map is one aggregate per node, sent as data and drawn
by Plotly, not templated cells); the page then applies live events from its topic.
"""

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db.models.functions import TruncDay, TruncHour, TruncMinute
from django.shortcuts import redirect, render
from django.utils import timezone

from controlplane import events
from controlplane.access import principal
from controlplane.errors import ServiceError
from controlplane.selectors import event_history, topic_seq
from controlplane.timerange import TimeRange, fitting, time_range
from fleet import selectors as fleet_selectors
from fleet.choices import NodeState
from fleet.status import cluster_status
from jobs import selectors as job_selectors
from jobs.choices import JobPhaseKind, JobState
from jobs.protection import cluster_jobs_protection
from jobs.services.jobs import job_submit
from tenancy import selectors as tenancy_selectors
from tenancy.models import Tenant

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


def provider_dashboard(user, window: TimeRange | None = None) -> dict:
    """The fleet dashboard's figures, heat maps and charts; the charts (faults per bucket, GPU-hours saved and
    lost cumulated) cover ``window`` (the last 7 days by default)."""
    now = window.now if window else timezone.now()
    since = window.since if window else now - timedelta(days=7)
    truncate = TRUNCATE[window.bucket if window else "hour"]
    clusters = fleet_selectors.dashboard_clusters(user=user)
    ids = [c.pk for c in clusters]
    status = cluster_status(ids)
    capacity = fleet_selectors.fleet_capacity(user=user)
    recoveries = job_selectors.recovery_dashboard(user=user, now=now, since=since, truncate=truncate)
    on_version = sum(
        1
        for c in clusters
        if c.blueprint_version_id and status[c.pk].total and status[c.pk].ready == status[c.pk].total
    )
    maps = fleet_selectors.node_heatmaps(user=user, cluster_ids=ids)
    figures = recoveries["figures"]
    return {
        "figures": {
            "clusters": len(clusters),
            "nodes": capacity["nodes"],
            "spare_nodes": capacity["spare_nodes"],
            "nodes_out": capacity["nodes_out"],
            "gpus": capacity["gpus"],
            "gpus_healthy": capacity["gpus_healthy"],
            "faults_24h": figures["faults_24h"],
            "faults_open": figures["faults_open"],
            "compliant": on_version,
            "with_blueprint": sum(1 for c in clusters if c.blueprint_version_id),
            "saved_today": figures["saved_today"],
            "saved_30d": figures["saved_30d"],
            "lost_today": figures["lost_today"],
            "lost_30d": figures["lost_30d"],
            "expected": figures["expected"],
        },
        "clusters": [
            {
                "id": c.pk,
                "name": c.name,
                "fleet": c.fleet.name,
                "tenant": c.dedicated_tenant.name if c.dedicated_tenant else "shared",
                "version": str(c.blueprint_version) if c.blueprint_version else "—",
                "sync": status[c.pk].sync,
                "health": status[c.pk].health,
                "ready": status[c.pk].label,
                "heatmap": maps[c.pk],
                "summary": heatmap_summary(maps[c.pk]),
            }
            for c in clusters
        ],
        # Median time to acknowledge, recover and resolve, fleet-wide and per cluster, over the last 30 days.
        "incident_medians": job_selectors.incident_medians(user=user, since=now - timedelta(days=30)),
        "charts": {
            "faults": recoveries["faults"],
            "saved": recoveries["saved"],
            "lost": recoveries["lost"],
            "range": window.as_data() if window else None,
        },
    }


def tenant_dashboard(user, tenant: Tenant) -> dict:
    """A tenant's jobs, clusters (those its jobs run on and those dedicated to it), uptime over 30 days and
    GPU-hours saved and lost."""
    now = timezone.now()
    jobs = job_selectors.tenant_recent_jobs(user=user, tenant_id=tenant.pk)
    clusters = {job.cluster_id: job.cluster for job in jobs}
    for cluster in fleet_selectors.dedicated_clusters(user=user, tenant_id=tenant.pk):
        clusters[cluster.pk] = cluster
    durations = job_selectors.tenant_phase_seconds(
        user=user, tenant_id=tenant.pk, since=now - timedelta(days=30), now=now
    )
    running, recovering = (
        durations.get(JobPhaseKind.RUNNING, 0.0),
        durations.get(JobPhaseKind.RECOVERING, 0.0),
    )
    uptime = running / (running + recovering) if running + recovering else None
    recoveries = job_selectors.tenant_recovery_figures(user=user, tenant_id=tenant.pk)
    return {
        "jobs": jobs,
        "clusters": [
            {
                "cluster": c,
                # The verdict of each job's page (jobs.protection), over the tenant's running jobs there.
                "protection": cluster_jobs_protection(c, jobs, at=now),
                "dedicated": c.dedicated_tenant_id == tenant.pk,
            }
            for c in clusters.values()
        ],
        "saved": recoveries["saved"],
        "lost": recoveries["lost"],
        "uptime": uptime,
        "expected": recoveries["expected"],
        "recovering_now": recoveries["recovering_now"],
        "running": sum(1 for j in jobs if j.state == JobState.RUNNING),
        "submit_clusters": fleet_selectors.submit_clusters(user=user, tenant_id=tenant.pk),
        "users": tenancy_selectors.tenant_members(user=user, tenant_id=tenant.pk),
    }


# The submit form places simulated jobs on nodes of this many GPUs (the service's default).
SUBMIT_GPUS_PER_NODE = 8


def _submit(request, tenant: Tenant) -> str | None:
    """The submit form: validates shape, then the job service decides. Returns an error to show, or None."""
    try:
        cluster_id = int(request.POST.get("cluster", "0"))
        gpus = int(request.POST.get("gpus", "0"))
        seconds = float(request.POST.get("seconds_per_iteration") or 2.0)
        interval = int(request.POST.get("checkpoint_interval") or 500)
    except ValueError:
        return "Choose a cluster and give whole numbers."
    # One of the clusters the form offers; any other id, another tenant's or none, gets the same answer.
    cluster = next(
        (
            c
            for c in fleet_selectors.submit_clusters(user=request.user, tenant_id=tenant.pk)
            if c.pk == cluster_id
        ),
        None,
    )
    if cluster is None:
        return "No such cluster for this tenant: choose one of the clusters listed."
    name = (request.POST.get("name") or "").strip()[:100]
    if not name:
        return "Give the job a name."
    if not 1 <= gpus <= 4096 or interval < 1:
        return "GPUs must be between 1 and 4096, the checkpoint interval at least 1."
    try:
        job_submit(
            actor=request.user,
            tenant=tenant,
            cluster=cluster,
            name=name,
            gpus=gpus,
            gpus_per_node=SUBMIT_GPUS_PER_NODE,
            seconds_per_iteration=seconds,
            checkpoint_interval=interval,
            total_iterations=10_000_000,
        )
    except ServiceError as error:
        if error.status == 409 and error.field == "gpus":
            # The service counts nodes ("needs 63"); the form asked for GPUs, so say it in both.
            nodes = -(-gpus // SUBMIT_GPUS_PER_NODE)
            return (
                f"{cluster.name} has too few free nodes for {gpus:,} GPUs: they take {nodes:,} free ready "
                f"nodes of {SUBMIT_GPUS_PER_NODE} GPUs. Ask for fewer GPUs or choose another cluster."
            )
        return f"{error.field + ': ' if error.field else ''}{error.detail}"
    return None


@login_required
def home(request):
    """The provider's fleet dashboard, or the tenant's own view; a user with no role sees an explanation."""
    who = principal(request.user)
    if who.is_provider:
        topic = events.topic("fleet")
        after = topic_seq(topic)  # read before the snapshot: events after it are applied on top
        # The charts open on a window that holds the fleet's data: its first hour, not one spike in 7 days.
        window = time_range(
            request, default=lambda now: fitting(job_selectors.first_fault_at(user=request.user), now=now)
        )
        data = provider_dashboard(request.user, window)
        return render(
            request,
            "home/provider.html",
            {
                "data": data,
                "topic": topic,
                "after": after,
                "who": who,
                "time_range": window,
                "history": event_history(user=request.user, topic=topic, up_to=after),
            },
        )
    if who.tenant_id is None:
        return render(request, "home/none.html", {"who": who})
    tenant = tenancy_selectors.tenant_of(user=request.user, tenant_id=who.tenant_id)
    error = None
    if request.method == "POST" and who.may_submit_jobs(tenant.pk):
        error = _submit(request, tenant)
        if error is None:
            return redirect("home")
    topic = events.topic("tenant", tenant.pk)
    after = topic_seq(topic)
    # A refused submission shows the form as it was sent, so the reader corrects it instead of retyping it.
    submitted = request.POST if error else {}
    return render(
        request,
        "home/tenant.html",
        {
            "tenant": tenant,
            "data": tenant_dashboard(request.user, tenant),
            "who": who,
            "topic": topic,
            "after": after,
            "error": error,
            "submitted": submitted,
            "history": event_history(user=request.user, topic=topic, up_to=after),
        },
    )
