"""Pages: the job list, the job page (live Plotly timeline, its incidents) and the fault overview (live feed of
incidents and their reports, GPU-hours saved)."""

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.db.models import Q, Sum
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django_filters.views import FilterView
from django_tables2 import SingleTableMixin

from controlplane.access import principal
from controlplane.events import may_subscribe
from controlplane.pagination import OneMomentPaginator
from controlplane.selectors import topic_seq
from fleet.models import Cluster
from jobs import figures, selectors
from jobs.filtersets import JobFilterSet
from jobs.services.common import protection_of
from jobs.tables import JobTable


class JobListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """Training jobs the reader may see: sortable, filtered by the same FilterSet as /api/v1/jobs/, live."""

    template_name = "jobs/job_list.html"
    paginator_class = OneMomentPaginator
    table_class = JobTable
    filterset_class = JobFilterSet

    def get_queryset(self):
        saved = Sum("actions__gpu_hours_saved", filter=Q(actions__state="succeeded", actions__dry_run=False))
        return (selectors.job_list(user=self.request.user).select_related("tenant", "cluster")
                .annotate(gpu_hours_saved=saved))

    def get_table(self, **kwargs):
        table = super().get_table(**kwargs)
        who = principal(self.request.user)
        topic = "fleet" if who.is_provider else (f"tenant-{who.tenant_id}" if who.tenant_id else "")
        table.attrs = {"class": "table", "id": "job-table", "data-topic": topic, "data-after": topic_seq(topic)}
        return table


@login_required
def job_detail(request, pk: int):
    job = get_object_or_404(selectors.job_list(user=request.user), pk=pk)
    topic = f"job-{job.pk}"
    after = topic_seq(topic)   # read before the snapshot: events after it are applied on top, duplicates dropped
    timeline = figures.job_timeline(job)
    return render(request, "jobs/job.html", {
        "job": job, "timeline": timeline, "topic": topic, "after": after, "protection": protection_of(job.cluster),
        "allocations": job.allocations.filter(released_at__isnull=True).select_related("node"),
        "actions": selectors.action_list(user=request.user).filter(job=job).order_by("-planned_at")[:50],
        "incidents": selectors.job_incidents(user=request.user, job=job),
        "who": principal(request.user),
    })


@login_required
def fault_overview(request):
    """Live fault feed (an incident a row, its reports folded under it) and GPU-hours saved over time: the
    fleet's for provider roles, the tenant's own otherwise."""
    who = principal(request.user)
    topic = "fleet" if who.is_provider else (f"tenant-{who.tenant_id}" if who.tenant_id else "")
    faults = selectors.fault_list(user=request.user)
    actions = selectors.action_list(user=request.user)
    if not who.is_provider:
        faults = faults.filter(actions__job__tenant_id=who.tenant_id).distinct()
    cluster = None
    if request.GET.get("cluster", "").isdigit():
        # One cluster's feed (for the cluster page to link to): only where the reader may follow its topic.
        cluster = get_object_or_404(Cluster, pk=int(request.GET["cluster"]))
        if not may_subscribe(request.user, f"cluster-{cluster.pk}"):
            raise Http404
        topic = f"cluster-{cluster.pk}"
        faults, actions = faults.filter(cluster=cluster), actions.filter(cluster=cluster)
    after = topic_seq(topic)
    stats = figures.gpu_hours_stats(actions=actions, faults=faults,
                                    group="fleet" if who.is_provider else "tenant", bucket="minute")
    return render(request, "jobs/fault_overview.html", {
        "topic": topic, "after": after, "feed": selectors.fault_feed(user=request.user, cluster=cluster),
        "stats": stats, "who": who, "cluster": cluster,
    })
