from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render

from controlplane import events
from controlplane.access import principal, require
from controlplane.errors import ServiceError
from controlplane.selectors import topic_seq
from controlplane.timerange import time_range
from simulator import selectors
from simulator.profiles import PROFILES
from simulator.services.whatifs import whatif_start


def _provider(request):
    require(principal(request.user).is_provider)


@login_required
def whatif_list(request):
    """Start a what-if replay and see past ones."""
    _provider(request)
    error = None
    if request.method == "POST":
        data = {}
        for name, cast in (
            ("seed", int),
            ("gpus", int),
            ("days", float),
            ("checkpoint_minutes", float),
            ("restart_overhead_minutes", float),
            ("checkpoint_write_seconds", float),
            ("migration_pause_seconds", float),
            ("spare_fraction", float),
        ):
            raw = request.POST.get(name, "").strip()
            if raw:
                try:
                    data[name] = cast(raw)
                except ValueError:
                    data[name] = raw
        if request.POST.get("profile"):
            data["profile"] = request.POST["profile"]
        try:
            run = whatif_start(actor=request.user, config=data)
        except ServiceError as problem:
            error = f"{problem.field}: {problem.detail}" if problem.field else problem.detail
        else:
            return redirect("whatif-detail", pk=run.pk)
    runs = selectors.whatif_list(user=request.user)[:50]
    return render(
        request, "simulator/whatif_list.html", {"runs": runs, "profiles": sorted(PROFILES), "error": error}
    )


@login_required
def whatif_detail(request, pk: int):
    _provider(request)
    run = get_object_or_404(selectors.whatif_list(user=request.user), pk=pk)
    topic = events.topic("fleet")
    return render(
        request, "simulator/whatif_detail.html", {"run": run, "topic": topic, "after": topic_seq(topic)}
    )


@login_required
def scenario_list(request):
    """Start the ab-nic scenario; see past ones."""
    from simulator.services.scenarios import abnic_start

    _provider(request)
    error = None
    if request.method == "POST":
        try:
            scenario = abnic_start(actor=request.user)
        except ServiceError as problem:
            error = problem.detail
        else:
            return redirect("scenario-detail", pk=scenario.pk)
    return render(
        request,
        "simulator/scenario_list.html",
        {"scenarios": selectors.scenario_list(user=request.user)[:20], "error": error},
    )


@login_required
def scenario_detail(request, pk: int):
    from jobs.figures import job_timeline, timeline_summary

    _provider(request)
    scenario = get_object_or_404(selectors.scenario_list(user=request.user), pk=pk)
    jobs = selectors.scenario_jobs(user=request.user, scenario=scenario)
    window = time_range(request, default="6h")
    data = {
        label: {
            "job": job.pk,
            "name": job.name,
            "cluster": job.cluster.name,
            "topic": events.topic("job", job.pk),
            "after": topic_seq(events.topic("job", job.pk)),
            "timeline": job_timeline(job, since=window.since),
            "range": window.key,
        }
        for label, job in jobs.items()
    }
    summary = "; ".join(
        f"{label} job {row['name']}: {timeline_summary(row['timeline'])['iterations']}"
        for label, row in data.items()
    )
    return render(
        request,
        "simulator/scenario_detail.html",
        {"scenario": scenario, "jobs": jobs, "data": data, "time_range": window, "summary": summary},
    )
