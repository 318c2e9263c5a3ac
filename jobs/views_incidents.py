"""Incidents as on-call work: the incident list (filtered, live) and the incident page's actions (acknowledge,
assign, note, resolve, reopen), each through the same service as the API's POST /api/v1/incidents/{id}/<action>/.
The incident page's work card is jobs.templatetags.incident_work's."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_filters.views import FilterView
from django_tables2 import SingleTableMixin

from controlplane.access import require
from controlplane.confirm import carry_out
from controlplane.pagination import OneMomentPaginator
from jobs import selectors
from jobs.filtersets import IncidentFilterSet
from jobs.forms_incidents import AssignForm, NoteForm, ResolveForm
from jobs.services import incident_work
from jobs.tables import IncidentTable
from jobs.templatetags.incident_work import live_topic


class IncidentListView(LoginRequiredMixin, SingleTableMixin, FilterView):
    """The incidents the reader may see, newest first: filtered by the API's FilterSet, sortable, live."""

    template_name = "jobs/incident_list.html"
    paginator_class = OneMomentPaginator
    table_class = IncidentTable
    filterset_class = IncidentFilterSet

    def get_queryset(self):
        return selectors.incident_work_list(user=self.request.user)

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **live_topic(self.request.user)}


def _assign_form(data, incident):
    return AssignForm(data, assignees=selectors.incident_assignees(incident=incident))


def _assigned(incident) -> str:
    return f"Assigned to {incident.assignee.username}." if incident.assignee_id else "Assigned to nobody."


# action -> (its form, or None; the service call from the actor, the incident and the form's data; what to say)
STEPS = {
    "acknowledge": (
        None,
        lambda actor, i, data: incident_work.incident_acknowledge(actor=actor, incident=i),
        "Acknowledged.",
    ),
    "assign": (
        _assign_form,
        lambda actor, i, data: incident_work.incident_assign(actor=actor, incident=i, assignee=data["user"]),
        _assigned,
    ),
    "note": (
        lambda data, i: NoteForm(data),
        lambda actor, i, data: incident_work.incident_note(actor=actor, incident=i, body=data["body"]),
        "Note added.",
    ),
    "resolve": (
        lambda data, i: ResolveForm(data),
        lambda actor, i, data: incident_work.incident_resolve(actor=actor, incident=i, cause=data["cause"]),
        "Resolved.",
    ),
    "reopen": (
        None,
        lambda actor, i, data: incident_work.incident_reopen(actor=actor, incident=i),
        "Reopened.",
    ),
}


@login_required
@require_POST
def incident_act(request, pk: int, action: str):
    """One step of the on-call work from the incident page: another tenant's incident is a 404, a role that may
    not take the step a 403, a form sent wrong or a step the incident's state refuses a message on the page."""
    if action not in STEPS:
        raise Http404("no such action")
    incident = get_object_or_404(selectors.incident_list(user=request.user), pk=pk)
    allowed = incident_work.may_annotate if action == "note" else incident_work.may_work
    require(allowed(request.user), f"you may not {action} incidents")
    back = reverse("incident-detail", args=[incident.pk]) + "#incident-work"
    form_for, call, done = STEPS[action]
    form = form_for(request.POST, incident) if form_for else None
    if form is not None and not form.is_valid():
        messages.error(
            request,
            " ".join(f"{form[name].label}: {' '.join(errors)}" for name, errors in form.errors.items()),
        )
        return redirect(back)
    data = form.cleaned_data if form is not None else {}
    return carry_out(request, lambda: call(request.user, incident, data), done=done, back=back)
