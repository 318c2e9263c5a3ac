from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render

from controlplane.access import principal
from controlplane.errors import ServiceError
from controlplane.selectors import topic_seq
from simulator import selectors
from simulator.profiles import PROFILES
from simulator.services import whatif_start


def _provider(request):
    if not principal(request.user).is_provider:
        raise PermissionDenied


@login_required
def whatif_list(request):
    """Start a what-if replay and see past ones."""
    _provider(request)
    error = None
    if request.method == "POST":
        data = {}
        for name, cast in (("seed", int), ("gpus", int), ("days", float), ("checkpoint_minutes", float),
                           ("restart_overhead_minutes", float)):
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
    return render(request, "simulator/whatif_list.html", {"runs": runs, "profiles": sorted(PROFILES), "error": error})


@login_required
def whatif_detail(request, pk: int):
    _provider(request)
    run = get_object_or_404(selectors.whatif_list(user=request.user), pk=pk)
    return render(request, "simulator/whatif_detail.html", {"run": run, "after": topic_seq("fleet")})
