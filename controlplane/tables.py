import django_tables2 as tables

from controlplane.models import AuditEntry


class AuditEntryTable(tables.Table):
    created_at = tables.DateTimeColumn(verbose_name="When", format="Y-m-d H:i:s")
    actor_name = tables.Column(verbose_name="Who")
    changes = tables.JSONColumn(orderable=False, verbose_name="Change")

    class Meta:
        model = AuditEntry
        attrs = {"class": "table"}
        fields = ("created_at", "actor_name", "token_prefix", "source", "action", "object_type", "object_repr", "changes")
        order_by = ("-created_at",)
        per_page = 50
        empty_text = "Nothing matches: every write through a page, the API or the command line is recorded here."

    def render_created_at(self, value):
        from controlplane.templatetags.figures import when

        return when(value)
