import django_filters

from controlplane.models import AuditEntry


class AuditEntryFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEntry
        fields = ["action", "object_type", "object_id", "source", "tenant_id"]
