"""One FilterSet per model, serving both its list page and its API endpoint.

The choices of a filter that names another object (a cluster, a tenant, a job) are what the reader may see:
a filter form must not list the other tenant's clusters or the tenants' names (the isolation matrix holds it).
"""

import django_filters
from django import forms
from django.db.models import Q

from jobs.choices import FaultKind, IncidentScope, IncidentState
from jobs.models import FaultEvent, Incident, Job, RecoveryAction, SlurmJob
from jobs.models.incidents import IncidentCause, IncidentWork


def _user(request):
    return getattr(request, "user", None)


def _clusters(request):
    from fleet.selectors import cluster_catalog

    return cluster_catalog(user=_user(request))


def _nodes(request):
    from fleet.selectors import node_list

    return node_list(user=_user(request))


def _tenants(request):
    from tenancy.selectors import tenant_list

    return tenant_list(user=_user(request))


def _jobs(request):
    from jobs.selectors import job_list

    return job_list(user=_user(request))


def _moment():
    """A date and time field the browser helps to fill (ISO 8601 either way)."""
    return forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


def _faults(request):
    from jobs.selectors import fault_list

    return fault_list(user=_user(request))


class JobFilterSet(django_filters.FilterSet):
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)
    tenant = django_filters.ModelChoiceFilter(queryset=_tenants)
    simulated = django_filters.BooleanFilter(method="_simulated", label="runs on a simulated cluster")
    reports_progress = django_filters.BooleanFilter(label="reports its own progress")

    class Meta:
        model = Job
        fields = ["state", "cluster", "tenant", "simulated", "reports_progress"]

    def _simulated(self, queryset, name, value):
        from fleet.choices import DriverName

        rows = queryset.filter(cluster__driver=DriverName.SIMULATED)
        return rows if value else queryset.exclude(pk__in=rows.values("pk"))


class FaultEventFilterSet(django_filters.FilterSet):
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)
    node = django_filters.ModelChoiceFilter(queryset=_nodes)

    class Meta:
        model = FaultEvent
        fields = ["state", "kind", "cluster", "node", "severity", "needs_human"]


# The incident list's enum labels in words (the choices' own values are codes).
FAULT_KIND_WORDS = {
    "nic_down": "NIC down",
    "link_flap": "Link flapping",
    "link_degraded": "Link degraded",
    "gpu_xid": "GPU Xid error",
    "ecc_uncorrectable": "Uncorrectable ECC error",
    "nvlink_error": "NVLink error",
    "node_unreachable": "Node unreachable",
    "thermal": "Overheating",
    "facility": "Facility (power, cooling)",
    "straggler": "Straggler (slow rank)",
    "predicted_failure": "Predicted failure",
    "software_crash": "Software crash",
    "hang": "Hang",
    "drain": "Drain (on purpose)",
}
INCIDENT_STATE_WORDS = {"open": "Still reporting or recovering", "resolved": "Recovered (reports stopped)"}
INCIDENT_SCOPE_WORDS = {"node": "The whole node", "nic": "One NIC"}


def _words(choices, words: dict) -> list[tuple[str, str]]:
    return [(value, words.get(value, label)) for value, label in choices.choices]


class IncidentFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="_search", label="Search (host, cluster, kind or number)")
    work_state = django_filters.ChoiceFilter(choices=IncidentWork.choices, label="Work", empty_label="Any")
    state = django_filters.ChoiceFilter(
        choices=_words(IncidentState, INCIDENT_STATE_WORDS), label="Failure", empty_label="Any"
    )
    kind = django_filters.ChoiceFilter(
        choices=_words(FaultKind, FAULT_KIND_WORDS), label="Kind", empty_label="Any"
    )
    scope = django_filters.ChoiceFilter(
        choices=_words(IncidentScope, INCIDENT_SCOPE_WORDS), label="Scope", empty_label="Any"
    )
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters, empty_label="Any")
    node = django_filters.ModelChoiceFilter(queryset=_nodes, empty_label="Any")
    job = django_filters.ModelChoiceFilter(
        queryset=_jobs,
        field_name="actions__job",
        distinct=True,
        empty_label="Any",
        label="Job it hit",
    )
    tenant = django_filters.ModelChoiceFilter(
        queryset=_tenants,
        method="_tenant",
        field_name="cluster__dedicated_tenant",  # its type, for the schema; _tenant reads the jobs it hit too
        empty_label="Any",
        label="Tenant (its cluster's or a job it hit)",
    )
    cause = django_filters.ChoiceFilter(choices=IncidentCause.choices, label="Cause", empty_label="Any")
    opened_after = django_filters.IsoDateTimeFilter(
        field_name="opened_at", lookup_expr="gte", label="Opened after", widget=_moment()
    )
    opened_before = django_filters.IsoDateTimeFilter(
        field_name="opened_at", lookup_expr="lt", label="Opened before", widget=_moment()
    )

    class Meta:
        model = Incident
        fields = [
            "q",
            "work_state",
            "state",
            "kind",
            "scope",
            "cluster",
            "node",
            "job",
            "tenant",
            "cause",
            "opened_after",
            "opened_before",
        ]

    def _search(self, queryset, name, value):
        value = value.strip()[:100]
        if not value:
            return queryset
        found = (
            Q(node__hostname__icontains=value)
            | Q(cluster__name__icontains=value)
            | Q(kind__icontains=value.replace(" ", "_"))
            | Q(nic_name__iexact=value)
        )
        if value.lstrip("#").isdigit():
            found |= Q(pk=int(value.lstrip("#")))
        return queryset.filter(found)

    def _tenant(self, queryset, name, value):
        hit = Q(cluster__dedicated_tenant=value) | Q(
            pk__in=RecoveryAction.objects.filter(job__tenant=value).values("incident_id")
        )
        return queryset.filter(hit)


class RecoveryActionFilterSet(django_filters.FilterSet):
    job = django_filters.ModelChoiceFilter(queryset=_jobs)
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)
    fault = django_filters.ModelChoiceFilter(queryset=_faults)

    class Meta:
        model = RecoveryAction
        fields = ["state", "kind", "job", "cluster", "fault", "dry_run"]


class SlurmJobFilterSet(django_filters.FilterSet):
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)
    unmapped = django_filters.BooleanFilter(
        field_name="job", lookup_expr="isnull", label="no Lockstep job (account maps to no tenant)"
    )

    class Meta:
        model = SlurmJob
        fields = ["cluster", "slurm_state", "account", "unmapped"]
