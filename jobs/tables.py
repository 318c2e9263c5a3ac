"""Tables of the jobs pages: sortable and paginated (django-tables2), filtered by the API's FilterSet."""

import django_tables2 as tables

from controlplane.templatetags.figures import number, when
from jobs.filtersets import FAULT_KIND_WORDS, INCIDENT_STATE_WORDS
from jobs.models import Incident, Job
from jobs.selectors import incident_times


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


def took(seconds) -> str:
    """A time span in words: ``4 min 12 s``, ``2 h 5 min``, ``3 d 4 h``; an em dash for none."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    for unit, size, smaller, smaller_size in (
        ("d", 86400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if seconds >= size:
            rest = (seconds % size) // smaller_size
            return f"{seconds // size} {unit}" + (f" {rest} {smaller}" if rest else "")
    return f"{seconds} s"


class IncidentTable(tables.Table):
    """The incident list: each incident's failure and where its on-call work stands."""

    id = tables.Column(linkify=("incident-detail", {"pk": tables.A("pk")}), verbose_name="Incident")
    kind = tables.Column(verbose_name="Kind")
    node = tables.Column(accessor="node__hostname", verbose_name="Node", order_by="node__hostname")
    cluster = tables.Column(accessor="cluster__name", verbose_name="Cluster", order_by="cluster__name")
    state = tables.Column(verbose_name="Failure")
    work_state = tables.Column(
        verbose_name="Work", attrs={"td": {"class": "state", "data-state": lambda record: record.work_state}}
    )
    assignee = tables.Column(accessor="assignee__username", verbose_name="Assigned to", default="—")
    cause = tables.Column(verbose_name="Cause", default="—")
    opened_at = tables.DateTimeColumn(verbose_name="Opened")
    to_acknowledge = tables.Column(empty_values=(), orderable=False, verbose_name="Time to acknowledge")
    to_resolve = tables.Column(empty_values=(), orderable=False, verbose_name="Time to resolve")

    class Meta:
        model = Incident
        fields = (
            "id",
            "kind",
            "node",
            "cluster",
            "state",
            "work_state",
            "assignee",
            "cause",
            "opened_at",
            "to_acknowledge",
            "to_resolve",
        )
        sequence = fields
        order_by = ("-opened_at",)
        per_page = 50
        row_attrs = {"data-incident": lambda record: record.pk}
        empty_text = "No incidents match."

    def render_id(self, value):
        return f"#{value}"

    def render_kind(self, record):
        words = FAULT_KIND_WORDS.get(record.kind, record.get_kind_display())
        return f"{words} {record.xid}" if record.xid is not None else words

    def render_state(self, record):
        return INCIDENT_STATE_WORDS.get(record.state, record.state)

    def render_work_state(self, record):
        return record.get_work_state_display()

    def render_cause(self, record):
        return record.get_cause_display()

    def render_opened_at(self, value):
        return when(value)

    def render_to_acknowledge(self, record):
        return took(incident_times(record)["acknowledge"])

    def render_to_resolve(self, record):
        return took(incident_times(record)["resolve"])
