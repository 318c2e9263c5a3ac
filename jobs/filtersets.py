"""One FilterSet per model, serving both its list page and its API endpoint.

The choices of a filter that names another object (a cluster, a tenant, a job) are what the reader may see:
a filter form must not list the other tenant's clusters or the tenants' names (the isolation matrix holds it).
"""

import django_filters

from jobs.models import FaultEvent, Incident, Job, RecoveryAction, SlurmJob


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


class IncidentFilterSet(django_filters.FilterSet):
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)
    node = django_filters.ModelChoiceFilter(queryset=_nodes)
    job = django_filters.ModelChoiceFilter(
        queryset=_jobs,
        field_name="actions__job",
        distinct=True,
        label="incidents that hit this job (a recovery of it was for the job)",
    )

    class Meta:
        model = Incident
        fields = ["state", "kind", "scope", "cluster", "node", "job"]


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
