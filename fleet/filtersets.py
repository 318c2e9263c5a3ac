"""One FilterSet per model, serving both its list page and its API endpoint."""

import django_filters
from django.db.models import Q

from fleet.choices import DriftKind, RolloutState, VersionState
from fleet.labels import with_labels
from fleet.models import Blueprint, Cluster, DriftFinding, Fleet, Node, Rollout
from tenancy.scoping import restrict, scope_condition

# The choices of a filter that names another object are what the reader may see: a filter form must not list
# the other tenant's clusters or the tenants' names (the isolation matrix holds it).


def _user(request):
    return getattr(request, "user", None)


def _fleets(request):
    from fleet.selectors import fleet_list

    return fleet_list(user=_user(request))


def _clusters(request):
    from fleet.selectors import cluster_list

    return cluster_list(user=_user(request))


def _tenants(request):
    from tenancy.selectors import tenant_list

    return tenant_list(user=_user(request))


class FleetFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Fleet
        fields = ["name", "automation"]


class ClusterFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search")
    label = django_filters.CharFilter(method="by_label", label="Label (key=value)")
    blueprint = django_filters.CharFilter(field_name="blueprint__name")
    version = django_filters.NumberFilter(field_name="blueprint_version__number")
    fleet = django_filters.ModelChoiceFilter(queryset=_fleets)
    dedicated_tenant = django_filters.ModelChoiceFilter(queryset=_tenants)

    class Meta:
        model = Cluster
        fields = ["fleet", "region", "tier", "kind", "driver", "track_latest", "dedicated_tenant"]

    # What a tenant user sees of a shared cluster is its outline (name, tier, blueprint version): a filter on any
    # other field would tell whether a shared cluster matches, so for tenant users it matches their own clusters only.
    OUTLINE_FILTERS = frozenset({"q", "blueprint", "version", "tier"})

    def filter_queryset(self, queryset):
        hidden = [
            name
            for name, value in self.form.cleaned_data.items()
            if name not in self.OUTLINE_FILTERS and value not in (None, "", [])
        ]
        if hidden:
            queryset = restrict(queryset, _user(self.request))
        return super().filter_queryset(queryset)

    def search(self, queryset, name, value):
        own = scope_condition(Cluster, _user(self.request))
        region = Q(region__icontains=value) if own is None else Q(region__icontains=value) & own
        return queryset.filter(Q(name__icontains=value) | region)

    def by_label(self, queryset, name, value):
        key, _, wanted = value.partition("=")
        return with_labels(queryset, {key: wanted}) if wanted else queryset.filter(labels__has_key=key)


class NodeFilterSet(django_filters.FilterSet):
    hostname = django_filters.CharFilter(lookup_expr="icontains")
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)

    class Meta:
        model = Node
        fields = ["cluster", "state", "rack", "leaf_switch", "gpu_model"]


class BlueprintFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Blueprint
        fields = ["name", "drift_mode", "auto_rollout"]


class RolloutFilterSet(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(choices=RolloutState.choices)
    blueprint = django_filters.CharFilter(field_name="version__blueprint__name")
    cluster = django_filters.NumberFilter(field_name="clusters__cluster", distinct=True)

    class Meta:
        model = Rollout
        fields = ["state", "version"]


class DriftFindingFilterSet(django_filters.FilterSet):
    open = django_filters.BooleanFilter(field_name="resolved_at", lookup_expr="isnull", label="Open")
    kind = django_filters.ChoiceFilter(choices=DriftKind.choices)
    addon = django_filters.CharFilter()
    since = django_filters.IsoDateTimeFilter(field_name="detected_at", lookup_expr="gte")
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters)

    class Meta:
        model = DriftFinding
        fields = ["cluster", "kind", "addon", "resolution"]


VERSION_STATES = VersionState.choices
