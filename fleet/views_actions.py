"""The fleet pages' write actions: rollouts (preview the batches, then start), pin or track a cluster, cordon,
drain and uncordon a node, a drift sweep, and the provider's automation switch (blueprint versions and YAML
import are in fleet/views_versions.py). Each calls the service the REST API calls (so it is audited and published
the same way), is refused (403) to roles DESIGN's permission table does not allow before any input is read, and
puts a service's refusal back on its form with the service's 4xx status."""

from collections import defaultdict

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.access import principal, require
from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.errors import ServiceError
from fleet import selectors
from fleet.choices import AutomationMode
from fleet.drivers import driver_for
from fleet.drivers.base import Operation
from fleet.forms import (
    AssignmentForm,
    AutomationForm,
    ReasonForm,
    RolloutForm,
)
from fleet.models import Cluster, ObservedAddon
from fleet.models.blueprints import PROTECTION_ADDONS
from fleet.overlays import effective_changes
from fleet.selectors import cluster_protection
from fleet.services.automation import automation_modes_for, automation_switch, automation_switch_set
from fleet.services.blueprints import latest_active
from fleet.services.clusters import cluster_assign, tracking_strategy
from fleet.services.drift import drift_sweep_now
from fleet.services.nodes import node_cordon, node_drain, node_uncordon
from fleet.services.rollouts import rollout_plan, rollout_start
from jobs import selectors as job_selectors
from jobs.protection import job_protection, runtime_policy_on


def require_operator(request):
    """Blueprints, rollouts, cordon and drain, sweeps: provider roles only (DESIGN), checked before the input."""
    require(principal(request.user).may_operate, "only provider roles (provider-admin, operator) may do this")


def put_back_on_form(form, error: ServiceError, fallback: str | None = None) -> None:
    """A service's refusal on the field it names (its last part: ``strategy.canary`` is ``canary``); the rollout
    form's ``targets`` is the input of the chosen kind."""
    field = (error.field or "").split(".")[-1].split("[")[0]
    if field == "targets" and "target_kind" in form.fields:
        kind = (getattr(form, "cleaned_data", None) or {}).get("target_kind")
        field = kind if kind in form.fields else "target_kind"
    form.add_error(field if field in form.fields else fallback, error.detail)


# --- rollouts ---------------------------------------------------------------------------------------------------


def blast_radius(user, batches: list[list[dict]], version) -> dict:
    """What the previewed rollout does to the jobs running on its clusters, writing nothing. Per cluster: the
    reader's running jobs, each with ``jobs.protection.job_protection``'s verdict now and with the cluster on
    ``version`` (the same verdict, given the target version's policy through an unsaved copy of the cluster),
    whether it moves to another blueprint and which protection flags of its policy it turns off. ``dropped`` counts
    the jobs protected now and not after; ``warned`` is true when any cluster switches blueprint or drops a flag
    (the start then needs the acknowledgement)."""
    ids = [c["id"] for batch in batches for c in batch][:500]
    clusters = {c.pk: c for c in selectors.cluster_list(user=user).filter(pk__in=ids)}
    running = defaultdict(list)
    for job in job_selectors.running_jobs_on(user=user, cluster_ids=ids):
        running[job.cluster_id].append(job)
    observed = defaultdict(list)
    for row in ObservedAddon.objects.filter(cluster_id__in=ids, name__in=PROTECTION_ADDONS.values()):
        observed[row.cluster_id].append(row)
    target_flags = version.effective_policy().get("protection") or {}
    now, per_cluster, dropped = timezone.now(), {}, 0
    for cid, cluster in clusters.items():
        current = cluster.blueprint_version
        flags = (current.effective_policy().get("protection") or {}) if current else {}
        after = Cluster(pk=cluster.pk, name=cluster.name, driver=cluster.driver, blueprint_version=version)
        verdicts = {
            "now": (cluster_protection(cluster=cluster, observed=observed[cid]), runtime_policy_on(cluster)),
            "after": (cluster_protection(cluster=after, observed=observed[cid]), runtime_policy_on(after)),
        }
        jobs = []
        for job in running[cid]:
            seen = {
                when: job_protection(job, at=now, cluster_verdict=simulated, policy=policy)
                for when, (simulated, policy) in verdicts.items()
            }
            dropped += seen["now"].protected and not seen["after"].protected
            jobs.append({"job": job, "now": seen["now"], "after": seen["after"]})
        switches = cluster.blueprint_id is not None and cluster.blueprint_id != version.blueprint_id
        per_cluster[cid] = {
            "jobs": jobs,
            "switch_from": cluster.blueprint.name if switches else None,
            "flags_off": sorted(
                key.replace("_", " ") for key, on in flags.items() if on and not target_flags.get(key)
            ),
        }
    warned = any(c["switch_from"] or c["flags_off"] for c in per_cluster.values())
    return {"clusters": per_cluster, "dropped": dropped, "warned": warned}


@login_required
@require_http_methods(["GET", "POST"])
def rollout_new(request):
    """Choose a version, targets and strategy; Preview shows the clusters and batches (the plan rollout_start
    would write, nothing written), what each carries now, its add-on changes and its blast radius (its running
    jobs, protected now and after); Start rolls out exactly the previewed plan, or shows the new one if it moved,
    and needs the acknowledgement when the preview warns of another blueprint or protection turned off."""
    require_operator(request)
    status, plan, plan_version, blast = 200, None, None, None
    if request.method == "GET":
        initial = {"target_kind": "clusters"}
        if request.GET.get("version"):
            initial["version"] = request.GET["version"][:40]
        form = RolloutForm(initial=initial)
    else:
        form = RolloutForm(request.POST)
        if not form.is_valid():
            status = 400
        else:
            version = form.version_object()
            if version is None:
                form.add_error("version", "no such version")
                status = 400
            else:
                plan_version = version
                try:
                    plan = rollout_plan(version=version, targets=form.targets(), strategy=form.strategy())
                except ServiceError as error:
                    put_back_on_form(form, error)
                    status = error.status
                else:
                    blast = blast_radius(request.user, plan.batches(), version)
                    status = start_previewed(request, form, plan, version, blast)
                    if not isinstance(status, int):
                        return status
    batches = plan.batches() if plan else []
    if batches:  # what each cluster carries now, beside its name
        ids = {c["blueprint_version_id"] for batch in batches for c in batch}
        labels = {
            v.pk: f"{v.blueprint.name} v{v.number}"
            for v in selectors.blueprint_versions(user=request.user, ids=ids)
        }
        changes = effective_changes([c["id"] for batch in batches for c in batch][:500], plan_version)
        for batch in batches:
            for cluster in batch:
                cluster["now_on"] = labels.get(cluster["blueprint_version_id"], "no version")
                cluster["changes"] = changes.get(cluster["id"], [])
                cluster["blast"] = blast["clusters"].get(cluster["id"])
    return render(
        request,
        "fleet/rollout_form.html",
        {"form": form, "plan": plan, "batches": batches, "blast": blast, "version": plan_version},
        status=status,
    )


def start_previewed(request, form, plan, version, blast) -> int | HttpResponse:
    """A Start of the previewed plan: the rollout's page when it started; otherwise the status the form is shown
    again with (200 for a preview, 409 when the plan moved, 400 without the acknowledgement a warning needs, the
    service's refusal). The form carries the plan it previewed."""
    key = ";".join(",".join(map(str, wave)) for wave in plan.waves)
    status = 200
    if "start" in request.POST and form.cleaned_data["plan"] != key:
        form.add_error(None, "The plan changed since the preview: check the batches below and start again.")
        status = 409
    elif "start" in request.POST and blast["warned"] and not form.cleaned_data["acknowledge_drop"]:
        form.add_error(
            "acknowledge_drop",
            f"This rollout moves a cluster to another blueprint or turns protection off: tick "
            f'"I understand protection is dropped for {blast["dropped"]} jobs" to start it.',
        )
        status = 400
    elif "start" in request.POST:
        try:
            rollout = rollout_start(
                actor=request.user, version=version, targets=form.targets(), strategy=form.strategy()
            )
        except ServiceError as error:
            put_back_on_form(form, error)
            status = error.status
        else:
            messages.success(
                request,
                f"Rollout #{rollout.pk} started: {len(plan.ready)} clusters in {len(plan.waves)} batches.",
            )
            return redirect("fleet-rollout", pk=rollout.pk)
    # The bound value renders from the data; its errors stay.
    data = form.data.copy()
    data["plan"] = key
    form.data = data
    return status


# --- clusters and nodes -----------------------------------------------------------------------------------------


@login_required
@require_POST
def cluster_assign_view(request, pk: int):
    """Pin the cluster to a version or let it track the latest, after a confirmation (it re-applies add-ons)."""
    require_operator(request)
    cluster = get_object_or_404(
        selectors.cluster_list(user=request.user).select_related("blueprint_version"), pk=pk
    )
    back = reverse("fleet-cluster", args=[cluster.pk])
    form = AssignmentForm(request.POST, cluster=cluster)
    if not form.is_valid():
        messages.error(
            request,
            "Choose a blueprint version: "
            + "; ".join(str(e) for errors in form.errors.values() for e in errors),
        )
        return redirect(back)
    values = form.parsed()
    blueprint = get_object_or_404(selectors.blueprint_list(user=request.user), pk=values.pop("blueprint"))
    label = dict(form.fields["assignment"].choices)[form.cleaned_data["assignment"]]
    if not confirmed(request):
        current = f"v{cluster.blueprint_version.number}" if cluster.blueprint_version_id else "no version"
        return confirm_page(
            request,
            title=f"{cluster.name}: {label}",
            question=f"{label.capitalize()} on {cluster.name}?",
            consequences=[
                f"It carries {current} of {cluster.blueprint.name if cluster.blueprint_id else '—'} now"
                f"{' and tracks the latest' if cluster.track_latest else ''}.",
                *(
                    tracking_consequences(cluster, blueprint)
                    if values.get("track_latest")
                    else ["If the version changes, its add-ons are re-applied (reconciled) right after."]
                ),
            ],
            action_url=request.path,
            back_url=back,
            button="Apply",
            danger=False,
            fields={"assignment": form.cleaned_data["assignment"], "reason": form.cleaned_data["reason"]},
        )
    return carry_out(
        request,
        lambda: cluster_assign(
            actor=request.user,
            cluster=cluster,
            blueprint=blueprint,
            reason=form.cleaned_data["reason"],
            **values,
        ),
        done=f"{cluster.name}: {label}.",
        back=back,
    )


def tracking_consequences(cluster, blueprint) -> list[str]:
    """What letting ``cluster`` track ``blueprint`` will roll out, and how (the rollout cluster_assign starts)."""
    latest = latest_active(blueprint)
    if latest is None:
        return [f"{blueprint.name} has no active version yet; nothing rolls out."]
    if latest.pk == cluster.blueprint_version_id:
        return [f"It already carries {latest}; later versions reach it by their rollouts."]
    try:
        strategy = tracking_strategy(blueprint=blueprint, cluster=cluster)
    except ServiceError as error:
        return [
            f"{latest} cannot roll out to it: the blueprint's default strategy is refused ({error.detail})."
        ]
    window = strategy["change_window"]
    return [
        f"It does not move at once: a rollout of {latest} to this cluster starts, with {blueprint.name}'s default "
        f"strategy.",
        f"The rollout applies {latest}, waits up to {strategy['progress_deadline_seconds']} s for it to be "
        f"healthy, then soaks {strategy['soak_seconds']} s and passes the fault-rate gate"
        + (f", inside the change window {window['start']}–{window['end']} UTC" if window else "")
        + ".",
        "If it fails, "
        + (
            "it is rolled back to the version it carries now."
            if strategy["auto_rollback"]
            else "it stops there."
        ),
    ]


NODE_ACTIONS = {
    "cordon": (Operation.CORDON, node_cordon, True, "No new work is placed on it; what runs there stays."),
    "drain": (
        Operation.DRAIN,
        node_drain,
        True,
        "No new work is placed on it, and its jobs are moved off it: migrated to a spare where protected, "
        "restarted from checkpoint elsewhere where not. Once none is left it is cordoned; its page says what "
        "the drain waits for.",
    ),
    "uncordon": (Operation.UNCORDON, node_uncordon, False, "It takes new work again."),
}


def node_actions_for(node) -> list[str]:
    """The node actions its driver supports and its state allows (what its page offers)."""
    allowed = {
        "ready": ("cordon", "drain"),
        "spare": ("cordon", "drain"),
        "cordoned": ("drain", "uncordon"),
        "draining": ("uncordon",),
        "failed": (),
    }.get(node.state, ())
    supports = driver_for(node.cluster).supports
    return [name for name in allowed if NODE_ACTIONS[name][0] in supports]


@login_required
@require_POST
def node_action(request, pk: int, action: str):
    """Cordon, drain (both after a confirmation) or uncordon a node, within the fleet's caps."""
    require_operator(request)
    if action not in NODE_ACTIONS:
        raise Http404("no such node action")
    node = get_object_or_404(selectors.node_list(user=request.user).select_related("cluster"), pk=pk)
    operation, service, confirm, effect = NODE_ACTIONS[action]
    back = reverse("node-detail", args=[node.pk])
    form = ReasonForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    if operation not in driver_for(node.cluster).supports:
        messages.error(request, f"The {node.cluster.driver} driver cannot {action}.")
        return redirect(back)
    if confirm and not confirmed(request):
        return confirm_page(
            request,
            title=f"{action.capitalize()} {node.hostname}",
            question=f"{action.capitalize()} {node.hostname} on {node.cluster.name}?",
            consequences=[effect],
            action_url=request.path,
            back_url=back,
            button=action.capitalize(),
            fields={"reason": reason},
        )
    return carry_out(
        request,
        lambda: service(actor=request.user, node=node, reason=reason or f"{action} from the node page"),
        done=(
            f"{node.hostname}: draining; its jobs move off it, and the Drain card below says what it waits for."
            if action == "drain"
            else f"{node.hostname}: {action} done."
        ),
        back=back,
    )


# --- drift and automation ---------------------------------------------------------------------------------------


@login_required
@require_POST
def drift_sweep_view(request):
    """Sweep every cluster now and say what the sweep did, with the counts the service returns."""
    require_operator(request)
    report = drift_sweep_now(actor=request.user)
    if report.skipped:
        messages.error(
            request, "Another drift sweep is running; this one did nothing. Try again in a moment."
        )
    else:
        messages.success(request, sweep_message(report.as_dict()))
    return redirect("fleet-drift")


def sweep_message(counts: dict) -> str:
    """The drift page's report of a sweep, from the counts ``SweepReport.as_dict`` returns."""
    parts = [
        f"{counts['clusters']} cluster{'s' if counts['clusters'] != 1 else ''} observed "
        f"({counts['checks']} add-on checks)",
        f"{counts['opened']} finding{'s' if counts['opened'] != 1 else ''} opened",
        f"{counts['resolved']} resolved",
        f"{counts['corrected']} corrected",
    ]
    for key, label in (
        ("would_correct", "would be corrected (dry-run)"),
        ("held", "held (automation paused)"),
        ("gave_up", "given up on"),
    ):
        if counts[key]:
            parts.append(f"{counts[key]} {label}")
    if counts["unreachable"]:
        parts.append(
            f"{counts['unreachable']} cluster{'s' if counts['unreachable'] != 1 else ''} unreachable"
        )
    return "Drift sweep: " + ", ".join(parts) + "."


@login_required
@require_POST
def automation_view(request):
    """Throw the provider-wide automation switch (the provider admin any mode, an operator dry-run or paused, as the
    service and the API require), after a confirmation that says what the new mode stops."""
    modes = automation_modes_for(request.user)
    require(bool(modes), "only provider roles may throw the provider-wide automation switch")
    require(
        request.POST.get("mode") not in AutomationMode.values or request.POST["mode"] in modes,
        "an operator may dry-run or pause automation; the provider admin sets it active",
    )
    form = AutomationForm(request.POST, modes=modes)
    back = reverse("fleet-overview")
    if not form.is_valid():
        messages.error(request, f"Choose {' or '.join(modes)}.")
        return redirect(back)
    mode, reason = form.cleaned_data["mode"], form.cleaned_data["reason"]
    current = automation_switch().mode
    if mode == current:
        messages.success(request, f"Automation is already {mode}.")
        return redirect(back)
    if not confirmed(request):
        effect = {
            AutomationMode.PAUSED: "Nothing acts anywhere: fault recovery, the escalation ladder, drift "
            "correction and rollout steps all hold.",
            AutomationMode.DRY_RUN: "Everything decides and records what it would do, and acts on nothing.",
            AutomationMode.ACTIVE: "Automation acts again wherever a cluster's and fleet's own modes allow.",
        }
        return confirm_page(
            request,
            title=f"Automation: {current} → {mode}",
            question=f"Set the provider-wide automation switch to {mode}?",
            consequences=[effect[mode]],
            action_url=request.path,
            back_url=back,
            button=f"Set {mode}",
            danger=mode != AutomationMode.ACTIVE,
            fields={"mode": mode, "reason": reason},
        )
    return carry_out(
        request,
        lambda: automation_switch_set(actor=request.user, mode=mode, reason=reason),
        done=f"Automation is now {mode} everywhere.",
        back=back,
    )
