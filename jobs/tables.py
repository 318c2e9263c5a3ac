"""Tables of the jobs pages: sortable and paginated (django-tables2), filtered by the API's FilterSet."""

import django_tables2 as tables

from controlplane.templatetags.figures import number, when
from jobs.models import Job


class JobTable(tables.Table):
    name = tables.Column(linkify=("job-detail", {"pk": tables.A("pk")}), verbose_name="Job")
    tenant = tables.Column(accessor="tenant__name", verbose_name="Tenant")
    cluster = tables.Column(accessor="cluster__name", verbose_name="Cluster")
    gpus = tables.Column(verbose_name="GPUs")
    state = tables.Column(attrs={"td": {"class": "state", "data-state": lambda record: record.state}})
    gpu_hours_saved = tables.Column(
        verbose_name="GPU-hours saved",
        attrs={
            "td": {
                "class": "saved",
                "data-digits": "2",
                "data-value": lambda record: record.gpu_hours_saved or 0,
            }
        },
    )
    started_at = tables.DateTimeColumn(verbose_name="Started")

    class Meta:
        model = Job
        fields = ("name", "tenant", "cluster", "gpus", "state", "gpu_hours_saved", "started_at")
        sequence = fields
        order_by = ("-started_at",)
        per_page = 50
        row_attrs = {"data-job": lambda record: record.pk}
        empty_text = "No jobs match. Submit one from your home page or with POST /api/v1/jobs/."

    def render_gpus(self, value):
        return number(value)

    def render_gpu_hours_saved(self, value):
        return number(value or 0, 2)

    def render_started_at(self, value):
        return when(value)
