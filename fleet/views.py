"""Fleet pages: overview, clusters, cluster, blueprint, rollout and drift. Thin: selectors read, services write."""

import json
from collections import Counter

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.db.models import Count, F, Func, IntegerField, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_filters.views import FilterView
from django_tables2 import RequestConfig, SingleTableMixin

from controlplane import events
from controlplane.access import principal, require
from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.pagination import OneMomentPaginator
from controlplane.selectors import event_history, topic_seq
from fleet import selectors
from fleet.choices import GPUHealth, NodeState, RolloutState
from fleet.desired import load_versions
from fleet.diffing import version_diff
from fleet.drivers import driver_for
from fleet.filtersets import ClusterFilterSet, DriftFindingFilterSet, RolloutFilterSet
from fleet.forms import AssignmentForm, AutomationForm
from fleet.models import GPU, BlueprintSource, Node, Rollout
from fleet.overlays import cluster_desired
from fleet.services import rollouts as rollout_services
from fleet.services.automation import automation_modes_for, automation_switch
from fleet.services.clusters import cluster_reconcile
from fleet.status import cluster_status, rollup
from fleet.tables import ClusterListTable, ClusterTable, DriftFindingTable, NodeTable, RolloutTable


def _fleet_line(payload) -> str:
    """A fleet event's line, as static/js/fleet.js writes a live one: name · status · reason."""
    payload = payload if isinstance(payload, dict) else {}
    return " · ".join(
        str(v)
        for v in (payload.get("name"), payload.get("status") or payload.get("state"), payload.get("reason"))
        if v
    )


def _live(user, *topics: str) -> dict:
    """What a page needs to go live: its topics, the sequence numbers it was rendered at, and the last events of
    its first topic up to there (the Live feed's history; later ones arrive live)."""
    seqs = [topic_seq(t) for t in topics]
    return {
        "live_topics": ",".join(topics),
        "live_after": ",".join(str(seq) for seq in seqs),
        "live_history": event_history(user=user, topic=topics[0], up_to=seqs[0], text=_fleet_line),
    }


class FleetOverviewView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """Clusters with their status roll-up; for provider roles also compliance (clusters per version) and drift."""

    template_name = "fleet/overview.html"
    paginator_class = OneMomentPaginator
    filterset_class = ClusterFilterSet
    table_class = ClusterTable

    def get_queryset(self):
        return selectors.cluster_list(user=self.request.user).select_related("blueprint").order_by("name")

    def get_table_kwargs(self):
        ids = list(self.object_list.values_list("pk", flat=True)[:5000])
        self._statuses = cluster_status(ids)
        drift = selectors.open_drift_counts(user=self.request.user, cluster_ids=ids)
        self._drift = drift
        return {"statuses": self._statuses, "drift": drift}

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        who = principal(self.request.user)
        context["who"] = who
        context["fleet_rollup"] = rollup(self._statuses.values())
        context["open_drift"] = sum(self._drift.values())
        if who.is_provider:
            context["compliance"] = (
                self.object_list.values(
                    "blueprint__name", "blueprint_version__number", "blueprint_version__state"
                )
                .annotate(n=Count("id"))
                .order_by("blueprint__name", "blueprint_version__number")
            )
            context["fleets"] = selectors.fleet_list(user=self.request.user).annotate(n=Count("clusters"))
            context.update(_live(self.request.user, events.topic("fleet")))
            switch = automation_switch()
            context["automation"] = switch
            context["automation_modes"] = automation_modes_for(self.request.user)
            context["automation_form"] = AutomationForm(
                initial={"mode": switch.mode}, modes=context["automation_modes"]
            )
        return context


class _ArrayLength(Func):
    """The length of a JSON array column (an allocation's ``gpu_indices``)."""

    function = "jsonb_array_length"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, function="json_array_length", **extra)


def _gpu_counts() -> dict:
    """The cluster list's GPU columns as annotations of the cluster rows, each a scalar subquery (so they do not
    multiply the node join, and the database evaluates them for the page's rows only): GPUs, GPUs held by a running
    allocation, GPUs not healthy, and nodes cordoned."""

    def per_cluster(rows, value) -> Coalesce:
        rows = rows.order_by().values("cluster_key").annotate(value=value).values("value")
        return Coalesce(Subquery(rows, output_field=IntegerField()), 0)

    gpus = GPU.objects.filter(node__cluster=OuterRef("pk")).annotate(cluster_key=F("node__cluster_id"))
    # the running allocations' GPUs, through the nodes' reverse relation (jobs' JobAllocation)
    held = Node.objects.filter(cluster=OuterRef("pk"), job_allocations__released_at__isnull=True).annotate(
        cluster_key=F("cluster_id")
    )
    cordoned = Node.objects.filter(cluster=OuterRef("pk"), state=NodeState.CORDONED).annotate(
        cluster_key=F("cluster_id")
    )
    return {
        "gpu_count": per_cluster(gpus, Count("pk")),
        "gpus_busy": per_cluster(held, Sum(_ArrayLength("job_allocations__gpu_indices"))),
        "gpus_faulty": per_cluster(gpus.exclude(health=GPUHealth.HEALTHY), Count("pk")),
        "nodes_cordoned": per_cluster(cordoned, Count("pk")),
    }


class ClusterListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """The clusters the reader sees in full (as on the fleet overview), each with its nodes, status, drift and a
    link to its fabric; filtered by the API's FilterSet, paged."""

    template_name = "fleet/cluster_list.html"
    paginator_class = OneMomentPaginator
    filterset_class = ClusterFilterSet
    table_class = ClusterListTable

    def get_queryset(self):
        return (
            selectors.cluster_list(user=self.request.user)
            .select_related("blueprint")
            .annotate(node_count=Count("nodes"), **_gpu_counts())
            .order_by("name")
        )

    def get_table_kwargs(self):
        ids = list(self.object_list.values_list("pk", flat=True)[:5000])
        drift = selectors.open_drift_counts(user=self.request.user, cluster_ids=ids)
        return {"statuses": cluster_status(ids), "drift": drift}


@login_required
def cluster_detail(request, pk: int):
    """Desired against observed add-ons, drift with its diff, nodes, and the cluster's rollouts."""
    cluster = get_object_or_404(
        selectors.cluster_list(user=request.user).select_related("fleet", "blueprint"), pk=pk
    )
    version = load_versions([cluster.blueprint_version_id]).get(cluster.blueprint_version_id)
    desired = cluster_desired(cluster, version)
    observed = {row.name: row for row in selectors.observed_addons(user=request.user, cluster=cluster)}
    addons = [
        {
            "name": name,
            "desired": desired.get(name),
            "observed": observed.get(name),
            # the values with the blueprint's overlays for this cluster layered on (shown where an overlay applies)
            "values_json": json.dumps(
                (desired.get(name) or {}).get("values") or {}, indent=2, sort_keys=True
            ),
        }
        for name in sorted(set(desired) | set(observed))
    ]
    nodes = NodeTable(cluster.nodes.annotate(gpu_count=Count("gpus")), prefix="nodes-")
    RequestConfig(request, paginate={"per_page": 100, "paginator_class": OneMomentPaginator}).configure(nodes)
    who = principal(request.user)
    findings = selectors.cluster_drift(user=request.user, cluster=cluster)
    labels = selectors.drift_resolution_labels(findings)
    for finding in findings:
        finding.resolution_label = labels.get(finding.pk, "")
    context = {
        "cluster": cluster,
        "version": version,
        "addons": addons,
        "nodes": nodes,
        "who": who,
        "status": cluster_status([cluster.pk])[cluster.pk],
        "findings": findings,
        "rollouts": selectors.cluster_rollouts(user=request.user, cluster=cluster)[:10],
        "supports": sorted(op.value for op in driver_for(cluster).supports),
        "assign_form": AssignmentForm(
            cluster=cluster,
            initial={
                "assignment": (
                    f"track:{cluster.blueprint_id}"
                    if cluster.track_latest
                    else f"pin:{cluster.blueprint_id}:{version.number}"
                    if version
                    else None
                )
            },
        )
        if who.may_operate
        else None,
        "ladders": selectors.cluster_ladders(user=request.user, cluster=cluster)[:50],
        **_live(request.user, events.topic("cluster", cluster.pk)),
    }
    return render(request, "fleet/cluster_detail.html", context)


@login_required
@require_POST
def cluster_reconcile_view(request, pk: int):
    require(principal(request.user).may_operate)
    cluster = get_object_or_404(selectors.cluster_list(user=request.user), pk=pk)
    return carry_out(
        request,
        lambda: cluster_reconcile(actor=request.user, cluster=cluster),
        done=reconcile_message,
        back=reverse("fleet-cluster", args=[pk]),
    )


def reconcile_message(result: dict) -> str:
    """What "Reconcile now" tells the operator. Re-applying is not yet correcting: the drift shown below closes
    when a drift sweep observes the add-ons as desired, so the message says what was re-applied and that."""
    applied, failed = result["corrected"], result["failed"]
    if not applied and not failed:
        return "Reconciled: the cluster already matches its blueprint version; nothing to re-apply."
    parts = []
    if applied:
        parts.append(
            f"re-applied {', '.join(applied)}; the drift findings close once the next drift sweep observes "
            f"{'them' if len(applied) > 1 else 'it'} as desired"
        )
    if failed:
        parts.append(f"could not re-apply {', '.join(failed)}")
    return "Reconcile: " + "; ".join(parts) + "."


@login_required
def blueprint_list(request):
    blueprints = selectors.blueprint_list(user=request.user).annotate(
        versions_count=Count("versions", distinct=True), clusters_count=Count("clusters", distinct=True)
    )
    return render(request, "fleet/blueprint_list.html", {"blueprints": blueprints})


def effective_contents(version) -> dict:
    """What a version carries once its parents are merged in (a child stores only its overrides): add-ons and
    node software in name order, each marked as set by this version or inherited."""
    own_addons = {addon.get("name") for addon in version.addons or []}
    own_software = set((version.node_software or {}).keys())
    addons = [
        {"name": name, "version": spec.get("version", ""), "own": name in own_addons}
        for name, spec in sorted(version.effective_addons().items())
    ]
    software = [
        {"name": name, "version": value, "own": name in own_software}
        for name, value in sorted(version.effective_node_software().items())
    ]
    return {"addons": addons, "node_software": software}


@login_required
def blueprint_detail(request, pk: int):
    """Versions, a diff between any two, clusters per version."""
    blueprint = get_object_or_404(selectors.blueprint_list(user=request.user), pk=pk)
    versions = list(blueprint.versions.select_related("parent").annotate(cluster_count=Count("clusters")))
    loaded = load_versions([v.pk for v in versions])
    for version in versions:
        version.effective = effective_contents(loaded[version.pk])
    by_number = {v.number: v for v in versions}
    diff, chosen = None, {}
    if len(versions) >= 2:
        try:
            chosen = {
                "from": int(request.GET.get("from", versions[-2].number)),
                "to": int(request.GET.get("to", versions[-1].number)),
            }
        except ValueError:
            chosen = {"from": versions[-2].number, "to": versions[-1].number}
        if chosen["from"] in by_number and chosen["to"] in by_number:
            loaded = load_versions([by_number[chosen["from"]].pk, by_number[chosen["to"]].pk])
            diff = version_diff(loaded[by_number[chosen["from"]].pk], loaded[by_number[chosen["to"]].pk])
    clusters = blueprint.clusters.select_related("blueprint_version").order_by(
        "blueprint_version__number", "name"
    )
    source = BlueprintSource.objects.filter(blueprint=blueprint).first()
    return render(
        request,
        "fleet/blueprint_detail.html",
        {
            "blueprint": blueprint,
            "versions": versions,
            "diff": diff,
            "chosen": chosen,
            "clusters": clusters[:500],
            "rollouts": selectors.blueprint_rollouts(user=request.user, blueprint=blueprint)[:20],
            "source": source,
            "source_commits": list(source.commits.select_related("version")[:20]) if source else [],
            "who": principal(request.user),
        },
    )


class RolloutListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    template_name = "fleet/rollout_list.html"
    paginator_class = OneMomentPaginator
    filterset_class = RolloutFilterSet
    table_class = RolloutTable

    def get_queryset(self):
        return selectors.rollout_list(user=self.request.user)


@login_required
def rollout_detail(request, pk: int):
    """Live progress per batch and per cluster; pause, resume, cancel and roll back for operators."""
    rollout = get_object_or_404(selectors.rollout_list(user=request.user), pk=pk)
    rows = list(
        rollout.clusters.select_related("cluster", "previous_version").order_by(
            "batch_index", "cluster__name"
        )
    )
    counts: dict[int, Counter] = {}
    for row in rows:
        counts.setdefault(row.batch_index, Counter())[row.status] += 1
    batches = [
        {"batch": b, "counts": dict(counts.get(b.index, {})), "total": sum(counts.get(b.index, {}).values())}
        for b in rollout.batches.all()
    ]
    return render(
        request,
        "fleet/rollout_detail.html",
        {
            "rollout": rollout,
            "batches": batches,
            "rows": rows,
            "who": principal(request.user),
            "progress": rollout_progress(rollout, rows),
            "actions": [a for a in ("pause", "resume", "cancel", "rollback") if _may(rollout, a)],
            **_live(request.user, events.topic("rollout", rollout.pk)),
        },
    )


def rollout_progress(rollout: Rollout, rows: list) -> dict:
    """What the rollout's progress line says: clusters done of all, and how it ended. A rolled-back rollout
    counts the clusters put back on their previous version, not the ones it had applied (those are undone); a
    failed or cancelled one says so. ``outcome`` is ok, bad or running (the line's colour)."""
    total = len(rows)
    finished = sum(1 for row in rows if row.status in ("Succeeded", "Failed", "TimedOut", "Skipped"))
    failed = sum(1 for row in rows if row.status in ("Failed", "TimedOut"))
    if rollout.state == RolloutState.ROLLED_BACK:
        back = sum(1 for row in rows if row.rolled_back_at)
        return {
            "done": back,
            "total": total,
            "outcome": "bad",
            "label": "Clusters rolled back",
            "text": f"rolled back: {back} of {total} cluster{'s' if total != 1 else ''} returned to their previous "
            f"version",
        }
    if rollout.state in (RolloutState.FAILED, RolloutState.CANCELLED):
        return {
            "done": finished,
            "total": total,
            "outcome": "bad",
            "label": "Clusters done",
            "text": f"{rollout.state.lower()}: {finished} of {total} done"
            + (f", {failed} failed" if failed else ""),
        }
    outcome = (
        "ok" if rollout.state == RolloutState.SUCCEEDED and not failed else ("bad" if failed else "running")
    )
    return {
        "done": finished,
        "total": total,
        "outcome": outcome,
        "label": "Clusters done",
        "text": f"{finished} of {total}" + (f", {failed} failed" if failed else ""),
    }


ROLLOUT_ACTIONS = {
    "pause": rollout_services.rollout_pause,
    "resume": rollout_services.rollout_resume,
    "cancel": rollout_services.rollout_cancel,
    "rollback": rollout_services.rollout_rollback,
}
# The destructive ones ask first: what the confirmation button says, and what follows.
CONFIRMED_ACTIONS = {
    "cancel": ("Cancel", "No further cluster is moved; clusters already moved keep the new version."),
    "rollback": (
        "Roll back",
        "Every cluster the rollout moved goes back to its previous version and is pinned "
        "there; the rest are skipped.",
    ),
}
ACTION_TARGET = {"pause": "Paused", "resume": "Running", "cancel": "Cancelled", "rollback": "RolledBack"}


def _may(rollout, action: str) -> bool:
    return rollout.may_become(ACTION_TARGET[action])


def rollback_lines(rollout, limit: int = 50) -> list[str]:
    """The rollback confirmation's lines: each cluster the rollout moved (and has not sent back yet) with the
    version it goes back to, as ``roll_back_locked`` will; the rest counted past ``limit``."""
    rows = rollout.clusters.filter(applied_at__isnull=False, rolled_back_at__isnull=True).select_related(
        "cluster", "previous_version__blueprint"
    )
    total = rows.count()
    if not total:
        return ["No cluster has moved yet: none goes back."]
    lines = [
        f"{row.cluster.name} goes back from {rollout.version} to "
        f"{row.previous_version if row.previous_version_id else 'no version'}."
        for row in rows.order_by("cluster__name")[:limit]
    ]
    return lines + ([f"… and {total - limit} more clusters."] if total > limit else [])


@login_required
@require_POST
def rollout_action(request, pk: int, action: str):
    require(
        principal(request.user).may_operate,
        "only provider roles may pause, resume, cancel or roll back a rollout",
    )
    if action not in ROLLOUT_ACTIONS:
        raise Http404
    rollout = get_object_or_404(selectors.rollout_list(user=request.user), pk=pk)
    kwargs = {} if action == "resume" else {"reason": request.POST.get("reason", "")[:300]}
    if action in CONFIRMED_ACTIONS and not confirmed(request):
        return confirm_page(
            request,
            title=f"{action.capitalize()} rollout #{rollout.pk}",
            question=f"{CONFIRMED_ACTIONS[action][0]} rollout #{rollout.pk} of {rollout.version}?",
            consequences=[
                CONFIRMED_ACTIONS[action][1],
                *(rollback_lines(rollout) if action == "rollback" else []),
            ],
            action_url=request.path,
            back_url=reverse("fleet-rollout", args=[rollout.pk]),
            button=CONFIRMED_ACTIONS[action][0],
            fields=kwargs,
        )
    return carry_out(
        request,
        lambda: ROLLOUT_ACTIONS[action](actor=request.user, rollout=rollout, **kwargs),
        done=f"Rollout #{rollout.pk}: {action} done.",
        back=reverse("fleet-rollout", args=[pk]),
    )


class DriftListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    template_name = "fleet/drift_list.html"
    paginator_class = OneMomentPaginator
    filterset_class = DriftFindingFilterSet
    table_class = DriftFindingTable

    def get_queryset(self):
        return selectors.drift_list(user=self.request.user)

    def get_table(self, **kwargs):
        table = super().get_table(**kwargs)
        # Only the page shown is labelled: one query whatever the number of findings.
        table.resolution_labels = selectors.drift_resolution_labels(
            [row.record for row in table.paginated_rows]
        )
        return table
