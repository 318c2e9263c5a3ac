import django_filters
from django import forms
from django.db.models import Max

from controlplane.models import AuditEntry
from controlplane.tables import object_kind

# How many of the most recently audited objects the page's object picker lists.
OBJECT_CHOICES = 300


class AuditEntryFilterSet(django_filters.FilterSet):
    """The audit trail's filters, for /api/v1/audit/ and the audit page. The API takes names and ids as they are;
    the page offers them as lists of names (``offer_choices``), so a reader picks an actor or an object rather
    than typing an id."""

    actor = django_filters.CharFilter(field_name="actor_name", label="Who", widget=forms.Select)
    action = django_filters.CharFilter(label="What", widget=forms.Select)
    object_type = django_filters.CharFilter(label="Kind of object", widget=forms.Select)
    object = django_filters.CharFilter(
        method="filter_object",
        label="Object",
        widget=forms.Select,
        help_text="kind:id, for example fleet.cluster:3",
    )
    object_id = django_filters.CharFilter(widget=forms.HiddenInput)
    tenant_id = django_filters.NumberFilter(label="Tenant", widget=forms.Select)
    since = django_filters.IsoDateTimeFilter(
        field_name="created_at",
        lookup_expr="gte",
        label="From",
        help_text="an ISO 8601 time, for example 2026-12-01T09:00Z",
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="created_at", lookup_expr="lt", label="Until", help_text="an ISO 8601 time"
    )

    class Meta:
        model = AuditEntry
        fields = [
            "actor",
            "action",
            "object_type",
            "object",
            "object_id",
            "source",
            "tenant_id",
            "since",
            "until",
        ]

    def filter_object(self, queryset, name, value):
        object_type, _, object_id = value.partition(":")
        return queryset.filter(object_type=object_type, object_id=object_id)

    def offer_choices(self) -> None:
        """Fill the page's pickers from the trail itself (and the tenants' names): a few aggregate queries the
        API does not pay for. A value given that the lists lack stays selectable."""
        from tenancy.models import Tenant

        entries = AuditEntry.objects.order_by()
        actors = entries.values_list("actor_name", flat=True).distinct()
        actions = entries.values_list("action", flat=True).distinct()
        kinds = entries.exclude(object_type="").values_list("object_type", flat=True).distinct()
        recent = (
            entries.exclude(object_id="")
            .values("object_type", "object_id", "object_repr")
            .annotate(last=Max("created_at"))
            .order_by("-last")[:OBJECT_CHOICES]
        )
        objects = {}
        for row in recent:
            key = f"{row['object_type']}:{row['object_id']}"
            objects.setdefault(
                key, f"{object_kind(row['object_type'])} {row['object_repr'] or '#' + row['object_id']}"
            )
        tenants = [(str(pk), name) for pk, name in Tenant.objects.order_by("name").values_list("pk", "name")]
        self._choices("actor", [(name, name or "system") for name in sorted(actors)])
        self._choices("action", [(action, action) for action in sorted(actions)])
        self._choices(
            "object_type", sorted(((kind, object_kind(kind)) for kind in kinds), key=lambda item: item[1])
        )
        self._choices("object", sorted(objects.items(), key=lambda item: item[1].lower()))
        self._choices("tenant_id", tenants)

    def _choices(self, name: str, choices: list[tuple[str, str]]) -> None:
        field = self.form.fields[name]
        given = self.form.data.get(name)
        if given and given not in {value for value, _ in choices}:
            choices = [*choices, (given, given)]
        field.widget.choices = [("", "any"), *choices]
