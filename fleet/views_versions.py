"""The blueprint pages' write actions: a new version (edit its YAML, preview it with its diffs against its
parent and the active version, create the draft), activating a draft after a confirmation, and importing a whole
blueprint document. Through the services the API's versions, activate and yaml endpoints call; provider roles
only (403 before any input is read)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.errors import ServiceError
from fleet import selectors
from fleet.choices import VersionState
from fleet.diffing import version_diff
from fleet.forms import BlueprintImportForm, VersionForm, content_yaml
from fleet.models import Blueprint, BlueprintVersion
from fleet.services import blueprints as blueprint_services
from fleet.services.blueprint_documents import blueprint_apply
from fleet.views_actions import put_back_on_form, require_operator


def _candidate(blueprint: Blueprint, parent_number: int | None, content: dict) -> BlueprintVersion:
    """The version the form describes, unsaved, with its parent chain loaded: what the diffs compare."""
    from fleet.desired import load_versions

    number = (blueprint.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    candidate = BlueprintVersion(blueprint=blueprint, number=number, **content)
    if parent_number is not None:
        parent = blueprint.versions.filter(number=parent_number).first()
        if parent is not None:
            candidate.parent = load_versions([parent.pk])[parent.pk]
    return candidate


def _diffs(blueprint: Blueprint, candidate: BlueprintVersion) -> list[dict]:
    """The candidate against its parent and against the blueprint's active version (latest active)."""
    from fleet.desired import load_versions

    out = []
    if candidate.parent_id:
        out.append(
            {
                "against": f"its parent v{candidate.parent.number}",
                "diff": version_diff(candidate.parent, candidate),
            }
        )
    active = blueprint_services.latest_active(blueprint)
    if active is not None:
        active = load_versions([active.pk])[active.pk]
        out.append(
            {"against": f"the active version v{active.number}", "diff": version_diff(active, candidate)}
        )
    return out


@login_required
@require_http_methods(["GET", "POST"])
def version_new(request, pk: int):
    """A new draft version: edit its YAML, Preview (validated, with the diffs, nothing written), Create draft."""
    require_operator(request)
    blueprint = get_object_or_404(selectors.blueprint_list(user=request.user), pk=pk)
    latest = blueprint.versions.select_related("parent").order_by("-number").first()
    status, diffs = 200, None
    if request.method == "GET":
        form = VersionForm(
            blueprint=blueprint,
            initial={
                "parent": latest.parent.number if latest and latest.parent_id else "",
                "content": content_yaml(latest),
            },
        )
    else:
        form = VersionForm(request.POST, blueprint=blueprint)
        if not form.is_valid():
            status = 400
        elif "create" in request.POST:
            data = form.cleaned_data
            try:
                version = blueprint_services.version_create(
                    actor=request.user,
                    blueprint=blueprint,
                    parent=data["parent"],
                    notes=data["notes"],
                    **data["content"],
                )
            except ServiceError as error:
                put_back_on_form(form, error, "content")
                status = error.status
            else:
                messages.success(
                    request,
                    f"Draft v{version.number} of {blueprint.name} created; activate it below "
                    f"when it is right.",
                )
                url = reverse("fleet-blueprint", args=[blueprint.pk])
                active = blueprint_services.latest_active(blueprint)
                if active is not None:
                    url += f"?from={active.number}&to={version.number}"
                return redirect(url)
        else:
            diffs = _diffs(
                blueprint, _candidate(blueprint, form.cleaned_data["parent"], form.cleaned_data["content"])
            )
    return render(
        request,
        "fleet/version_form.html",
        {"blueprint": blueprint, "form": form, "diffs": diffs, "latest": latest},
        status=status,
    )


@login_required
@require_POST
def version_activate(request, pk: int, number: int):
    """Activate a draft, after a confirmation that says which tracking clusters it will roll out to."""
    require_operator(request)
    blueprint = get_object_or_404(selectors.blueprint_list(user=request.user), pk=pk)
    version = get_object_or_404(blueprint.versions, number=number)
    back = reverse("fleet-blueprint", args=[blueprint.pk])
    if not confirmed(request):
        tracking = list(
            selectors.tracking_clusters(user=request.user, blueprint=blueprint)
            .exclude(blueprint_version=version)
            .order_by("name")
            .values_list("name", flat=True)
        )
        if tracking and blueprint.auto_rollout:
            moves = (
                f"A rollout with the blueprint's default strategy starts for the {len(tracking)} tracking "
                f"cluster{'s' if len(tracking) != 1 else ''}: {', '.join(tracking[:20])}"
                f"{'…' if len(tracking) > 20 else ''}."
            )
        elif tracking:
            moves = (
                f"{len(tracking)} cluster{'s' if len(tracking) != 1 else ''} track the latest version; the "
                f"blueprint waits for an operator to start their rollout."
            )
        else:
            moves = "No cluster tracks the latest version: nothing moves until a rollout or a pin."
        return confirm_page(
            request,
            title=f"Activate {blueprint.name} v{version.number}",
            question=f"Activate v{version.number}? An active version is immutable.",
            consequences=[moves],
            action_url=request.path,
            back_url=back,
            button="Activate",
            danger=False,
        )
    return carry_out(
        request,
        lambda: blueprint_services.version_activate(actor=request.user, version=version),
        done=f"{blueprint.name} v{version.number} is active.",
        back=back,
    )


@login_required
@require_http_methods(["GET", "POST"])
def blueprint_import(request):
    """Paste a whole blueprint document: Check shows what it describes against what exists; Apply applies it
    all or nothing, through the service PUT /api/v1/blueprints/{id}/yaml/ uses."""
    require_operator(request)
    form = BlueprintImportForm(request.POST or None)
    status, summary = 200, None
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            document = form.cleaned_data["document"]
            existing = selectors.blueprint_list(user=request.user).filter(name=document["name"]).first()
            if "apply" in request.POST:
                try:
                    blueprint, done = blueprint_apply(actor=request.user, document=document)
                except ServiceError as error:
                    form.add_error(
                        "document", f"{error.field}: {error.detail}" if error.field else error.detail
                    )
                    status = error.status
                else:
                    messages.success(
                        request, f"{blueprint.name}: " + ("; ".join(done) if done else "no change") + "."
                    )
                    return redirect("fleet-blueprint", pk=blueprint.pk)
            summary = _import_summary(document, existing)
    return render(request, "fleet/blueprint_import.html", {"form": form, "summary": summary}, status=status)


def _import_summary(document: dict, existing: Blueprint | None) -> dict:
    have = {v.number: v for v in existing.versions.all()} if existing else {}
    rows = []
    for entry in document.get("versions", []):
        current = have.get(entry["number"])
        wanted = entry.get("state", VersionState.DRAFT)
        if current is None:
            what = f"new version, {wanted}"
        elif current.state == wanted:
            what = f"exists ({current.state}); content must match if not a draft"
        else:
            what = f"{current.state} → {wanted}"
        rows.append({"number": entry["number"], "what": what, "addons": len(entry.get("addons") or [])})
    return {"name": document["name"], "exists": existing is not None, "versions": rows}
