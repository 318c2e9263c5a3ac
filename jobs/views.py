"""Pages: the job list, the job page (live Plotly timeline, its incidents, its nodes), the fault overview (live
feed of incidents and their reports, paged; GPU-hours saved), the incident page, the node page and search."""

from dataclasses import replace

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.paginator import InvalidPage
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_filters.views import FilterView
from django_tables2 import SingleTableMixin

from controlplane import events
from controlplane.access import principal, require
from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.pagination import OneMomentPaginator
from controlplane.selectors import topic_seq
from controlplane.timerange import PARAMETER, fitting, time_range
from fleet import selectors as fleet_selectors
from fleet.views_actions import node_actions_for
from jobs import figures, selectors
from jobs.choices import ACTIVE_JOB_STATES
from jobs.filtersets import JobFilterSet
from jobs.ledger import restart_bases
from jobs.protection import job_protection
from jobs.services import jobs as job_services
from jobs.services.estimates import restart_baseline_of
from jobs.tables import JobTable
from telemetry import selectors as telemetry_selectors

# The job page's default ranges, shortest first: the first that holds the job's life since it started.
JOB_RANGES = ("1h", "6h", "24h", "7d", "30d")


def _feed_topic(who) -> str:
    """The topic a reader's job list and fault feed follow: the fleet's for provider roles, a tenant user's own
    tenant's, none for a user of no tenant."""
    if who.is_provider:
        return events.topic("fleet")
    return events.topic("tenant", who.tenant_id) if who.tenant_id else ""


class JobListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """Training jobs the reader may see: sortable, filtered by the same FilterSet as /api/v1/jobs/, live."""

    template_name = "jobs/job_list.html"
    paginator_class = OneMomentPaginator
    table_class = JobTable
    filterset_class = JobFilterSet

    def get_queryset(self):
        return (
            selectors.job_list(user=self.request.user)
            .select_related("tenant", "cluster")
            .annotate(gpu_hours_saved=selectors.realized_saving())
        )

    def get_table(self, **kwargs):
        table = super().get_table(**kwargs)
        who = principal(self.request.user)
        topic = _feed_topic(who)
        after = topic_seq(topic)
        table.attrs = {
            "class": "table",
            "id": "job-table",
            "data-topic": topic,
            "data-after": after,
            "data-live-topics": topic,
            "data-live-after": after,
        }
        return table


@login_required
def job_detail(request, pk: int):
    job = get_object_or_404(selectors.job_list(user=request.user), pk=pk)
    topic = events.topic("job", job.pk)
    after = topic_seq(
        topic
    )  # read before the snapshot: events after it are applied on top, duplicates dropped
    # The timeline opens on a window that holds the job's life: a new job's first hour, not a spike in 30 days.
    started = job.started_at or job.created_at
    window = time_range(request, default=lambda now: fitting(started, now=now, keys=JOB_RANGES))
    timeline = figures.job_timeline(job, since=window.since)
    placements = list(selectors.job_allocations(user=request.user, job=job)[:200])
    incidents = selectors.job_incidents(user=request.user, job=job)
    actions = list(
        selectors.action_list(user=request.user)
        .filter(job=job)
        .select_related("incident")
        .order_by("-planned_at")[:50]
    )
    return render(
        request,
        "jobs/job.html",
        {
            "job": job,
            "timeline": timeline,
            "topic": topic,
            "after": after,
            "protection": job_protection(job),
            "restart_baseline": restart_baseline_of(job),
            "standbys": job.standbys.filter(released_at__isnull=True).select_related("node"),
            "time_range": window,
            "summary": figures.timeline_summary(timeline),
            "allocations": job.allocations.filter(released_at__isnull=True).select_related("node"),
            "actions": actions,
            "recovery_steps": _recovery_steps(actions),
            "incidents": incidents,
            "placements": placements,
            "node_ids": selectors.visible_node_ids(
                user=request.user, node_ids=[p.node_id for p in placements] + [i.node_id for i in incidents]
            ),
            "cluster_visible": fleet_selectors.sees_in_full(request.user, job.cluster),
            "who": principal(request.user),
            "may_cancel": job.state in ACTIVE_JOB_STATES
            and principal(request.user).may_submit_jobs(job.tenant_id),
        },
    )


def _recovery_steps(actions) -> list[dict]:
    """Each recovery that ended with the job training again, as its steps: detect (the first report of the
    fault), decide, replace (the driver's part: a rank replacement drains the lost node, a restart requeues the
    job) and training again (the job's first step after it, from its own report), with seconds since detection."""
    rows = []
    for action in actions:
        if action.resumed_at is None or action.dry_run:
            continue
        opened = action.incident.opened_at if action.incident_id else action.detected_at
        detected = min(opened, action.detected_at)
        steps = [
            ("detect", detected),
            ("decide", action.planned_at),
            ("replace" if action.kind == "rank_replacement" else "restart", action.started_at),
            ("training again", action.resumed_at),
        ]
        rows.append(
            {
                "action": action,
                "steps": [
                    {"name": name, "at": at, "seconds": (at - detected).total_seconds()}
                    for name, at in steps
                    if at is not None
                ],
            }
        )
    return rows


@login_required
@require_POST
def job_cancel(request, pk: int):
    """Cancel a job (provider roles, or its own tenant's admin), after a confirmation: the service the API's
    POST /api/v1/jobs/{id}/cancel/ calls."""
    job = get_object_or_404(selectors.job_list(user=request.user), pk=pk)
    require(principal(request.user).may_submit_jobs(job.tenant_id), "you may not cancel this job")
    back = reverse("job-detail", args=[job.pk])
    if not confirmed(request):
        return confirm_page(
            request,
            title=f"Cancel {job.name}",
            question=f"Cancel {job.name} on {job.cluster.name}?",
            consequences=[
                f"It stops for good and its {job.gpus} GPUs are released; recoveries under "
                f"way are dropped. Its last checkpoint is iteration "
                f"{job.last_checkpoint_iteration}."
            ],
            action_url=request.path,
            back_url=back,
            button="Cancel the job",
        )
    return carry_out(
        request,
        lambda: job_services.job_cancel(actor=request.user, job=job),
        done=f"{job.name} cancelled.",
        back=back,
    )


@login_required
def fault_overview(request):
    """Live fault feed (an incident a row, its reports folded under it) and GPU-hours saved over time: the
    fleet's for provider roles, the tenant's own otherwise."""
    who = principal(request.user)
    topic = _feed_topic(who)
    faults = selectors.job_fault_list(user=request.user)
    actions = selectors.action_list(user=request.user)
    cluster = None
    if request.GET.get("cluster", "").isdigit():
        # One cluster's feed (for the cluster page to link to): only where the reader may follow its topic,
        # which is where the reader sees the cluster in full (a 404 otherwise, like a missing one).
        cluster = get_object_or_404(
            fleet_selectors.cluster_list(user=request.user), pk=int(request.GET["cluster"])
        )
        topic = events.topic("cluster", cluster.pk)
        faults, actions = faults.filter(cluster=cluster), actions.filter(cluster=cluster)
    after = topic_seq(topic)
    page = request.GET.get("page", "1")
    if not page.isdigit():
        raise Http404("no such page")
    try:
        page_obj, feed = selectors.fault_feed(user=request.user, cluster=cluster, page=int(page))
    except InvalidPage as error:
        raise Http404("no such page") from error
    # The figures and the chart cover the page's time range (the feed below lists every fault, newest first).
    window = time_range(request, default="30d")
    stats = figures.gpu_hours_stats(
        actions=actions,
        faults=faults,
        group="fleet" if who.is_provider else "tenant",
        bucket="minute" if window.bucket == "minute" else "hour",
        since=window.since,
    )
    return render(
        request,
        "jobs/fault_overview.html",
        {
            "topic": topic,
            "after": after,
            "feed": feed,
            "page_obj": page_obj,
            "time_range": window,
            "is_paginated": page_obj.paginator.num_pages > 1,
            "stats": stats,
            "who": who,
            "cluster": cluster,
            "node_ids": selectors.visible_node_ids(
                user=request.user,
                node_ids=[(row.get("incident") or row.get("fault")).node_id for row in feed],
            ),
        },
    )


@login_required
def incident_detail(request, pk: int):
    """One incident: its reports, the recoveries of it the reader may see with the alternatives the planner
    weighed, and its ledger entry. Another tenant's incident is a 404, like a missing one."""
    incident = get_object_or_404(selectors.incident_list(user=request.user), pk=pk)
    who = principal(request.user)
    actions = selectors.incident_actions(user=request.user, incident=incident)
    faults = list(incident.faults.all())
    return render(
        request,
        "jobs/incident.html",
        {
            "incident": incident,
            "faults": faults,
            "actions": actions,
            "ledger": figures.incident_ledger(actions),
            "restart_baselines": restart_bases(
                [a for a in actions if a.state == "succeeded" and not a.dry_run and a.job_id is not None]
            ),
            "sources": selectors.sources_of(incident),
            "who": who,
            "show_decisions": selectors.sees_decisions(user=request.user, incident=incident),
            "cluster_visible": fleet_selectors.sees_in_full(request.user, incident.cluster),
            "node_ids": selectors.visible_node_ids(
                user=request.user,
                node_ids=[incident.node_id]
                + [pk for action in actions for pk in (action.node_id, action.to_node_id)],
            ),
        },
    )


# The node page's chart ranges, shortest first (a subset of controlplane.timerange.RANGES).
NODE_RANGES = ("1h", "6h", "24h", "7d")
NIC_FAULTS = frozenset({"nic_down", "link_flap", "link_degraded"})
# The node page's charts: (the series' key in telemetry.selectors.node_gpu_series, or the NIC counter group, title)
GPU_CHARTS = (
    ("temperature", "GPU temperature (°C)"),
    ("power", "GPU power (W)"),
    ("utilization", "GPU utilisation (%)"),
    ("ecc", "ECC errors since the driver loaded (corrected, uncorrected)"),
)
NIC_CHARTS = (
    ("bytes", "Bytes received and sent"),
    ("errors", "Errors"),
    ("drops", "Drops"),
    ("link changes", "Link changes"),
)


def _node_window(request):
    """The node page's range: one of NODE_RANGES (6 h where none is asked), the picker offering only those; None
    for a range the page does not offer (a 400)."""
    asked = request.GET.get(PARAMETER)
    if asked is not None and asked not in NODE_RANGES:
        return None
    window = time_range(request, default="6h")
    return replace(window, options=tuple(o for o in window.options if o["key"] in NODE_RANGES))


def _node_markers(faults, steps, since) -> list[dict]:
    """The node's faults (Xids and link changes as kinds of their own) and recovery actions inside the window,
    for the charts' shared time axis; from the rows the page already loaded, so no query."""
    markers = []
    actions = {action.pk: action for fault in faults for action in fault.actions.all()}
    actions.update((action.pk, action) for action in steps)
    for fault in faults:
        if fault.detected_at < since:
            continue
        kind = "xid" if fault.xid is not None else "link" if fault.kind in NIC_FAULTS else "fault"
        label = f"{fault.kind} {fault.xid}" if fault.xid is not None else fault.kind
        markers.append(
            {
                "at": fault.detected_at.isoformat(),
                "kind": kind,
                "label": label,
                "device": fault.device or "",
                "state": fault.state,
            }
        )
    for action in actions.values():
        if action.planned_at >= since:
            markers.append(
                {
                    "at": action.planned_at.isoformat(),
                    "kind": "action",
                    "label": action.kind,
                    "device": action.nic_name
                    or ("" if action.gpu_index is None else f"GPU {action.gpu_index}"),
                    "state": action.state,
                }
            )
    return sorted(markers, key=lambda marker: marker["at"])


@login_required
def node_detail(request, pk: int):
    """One node: its GPUs and NICs with their telemetry charted over a range (``?range=``, a range the page does
    not offer is a 400) and the node's faults and recoveries on the same time axis, its escalation ladder and the
    steps it took, its faults and the jobs that ran on it. A node of a cluster the reader does not see in full is
    a 404, like a missing one."""
    node = get_object_or_404(fleet_selectors.node_list(user=request.user), pk=pk)
    window = _node_window(request)
    if window is None:
        return HttpResponseBadRequest(f"range: one of {', '.join(NODE_RANGES)}.")
    allocations = list(selectors.node_allocations(user=request.user, node=node)[:200])
    ladder = selectors.node_ladder(user=request.user, node=node)
    faults = selectors.node_faults(user=request.user, node=node)
    charts = {
        "range": window.as_data(),
        "gpus": telemetry_selectors.node_gpu_series(
            user=request.user, node=node, since=window.since, until=window.now
        ),
        "nic_series": telemetry_selectors.node_nic_series(
            user=request.user, node=node, since=window.since, until=window.now
        ),
        **telemetry_selectors.node_device_state(user=request.user, node=node),
        "markers": _node_markers(faults, ladder["steps"], window.since),
    }
    return render(
        request,
        "fleet/node_detail.html",
        {
            "node": node,
            **fleet_selectors.node_hardware(user=request.user, node=node),
            "ladder": ladder,
            "drain": selectors.node_drain(user=request.user, node=node),
            "faults": faults,
            "charts": charts,
            "gpu_charts": GPU_CHARTS,
            "nic_charts": NIC_CHARTS,
            "raw_hours": settings.TELEMETRY_RAW_RETENTION_HOURS,
            "time_range": window,
            "current": [a for a in allocations if a.released_at is None],
            "past": [a for a in allocations if a.released_at is not None],
            "who": principal(request.user),
            "node_actions": node_actions_for(node) if principal(request.user).may_operate else [],
        },
    )


@login_required
def search(request):
    """The header's search: clusters, nodes by hostname, jobs and incidents the reader may see, each linking to
    its page. An empty query shows the form; an over-long one (or one with a NUL) is a 400."""
    q = request.GET.get("q", "").strip()
    if len(q) > selectors.SEARCH_MAX_LENGTH or "\x00" in q:
        return HttpResponseBadRequest(
            f"A search is at most {selectors.SEARCH_MAX_LENGTH} characters of text."
        )
    groups = selectors.search(user=request.user, q=q) if q else []
    return render(
        request,
        "jobs/search.html",
        {
            "q": q,
            "search_query": q,
            "groups": groups,
            "total": sum(len(group["rows"]) for group in groups),
        },
    )
