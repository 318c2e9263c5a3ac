"""Tables of the fleet pages: sortable, paginated (django-tables2), filtered by the same FilterSets as the API."""

import django_tables2 as tables
from django.urls import reverse
from django.utils.html import format_html

from controlplane.templatetags.figures import number, when
from fleet.models import Cluster, DriftFinding, Node, Rollout

ATTRS = {"class": "table"}


class ClusterTable(tables.Table):
    name = tables.Column(linkify=("fleet-cluster", {"pk": tables.A("pk")}))
    fleet = tables.Column(accessor="fleet__name", verbose_name="Fleet")
    version = tables.Column(
        accessor="blueprint_version__number",
        verbose_name="Version",
        order_by=("blueprint__name", "blueprint_version__number"),
    )
    assignment = tables.Column(accessor="track_latest", verbose_name="Assignment", orderable=False)
    status = tables.Column(empty_values=(), orderable=False, verbose_name="Status")
    drift = tables.Column(empty_values=(), orderable=False, verbose_name="Open drift")

    class Meta:
        model = Cluster
        attrs = ATTRS
        fields = ("name", "fleet", "region", "tier", "driver", "version", "assignment", "status", "drift")
        sequence = fields
        per_page = 50

    def __init__(self, *args, statuses=None, drift=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.statuses, self.drift_counts = statuses or {}, drift or {}

    def render_version(self, record):
        version = record.blueprint_version
        return f"{version.blueprint.name} v{version.number}" if version else "—"

    def render_assignment(self, record):
        if record.blueprint_version_id is None:
            return "—"
        return (
            "tracks latest"
            if record.track_latest
            else format_html('pinned <span class="muted">{}</span>', record.pinned_reason)
        )

    def render_status(self, record):
        rollup = self.statuses.get(record.pk)
        if rollup is None:
            return "—"
        return format_html(
            '<span class="status status-{}" data-cluster-status="{}">{} / {} · {}</span>',
            rollup.health.lower(),
            record.pk,
            rollup.sync,
            rollup.health,
            rollup.label,
        )

    def render_drift(self, record):
        count = self.drift_counts.get(record.pk, 0)
        return format_html('<span class="{}">{}</span>', "bad" if count else "muted", count)


class ClusterListTable(ClusterTable):
    """The clusters page: the overview's columns, the cluster's nodes and a link to its fabric."""

    nodes = tables.Column(accessor="node_count", verbose_name="Nodes")
    # annotations of the rows (fleet.views.ClusterListView): no query per row
    gpus = tables.Column(accessor="gpu_count", verbose_name="GPUs", attrs={"td": {"data-column": "gpus"}})
    gpus_busy = tables.Column(verbose_name="GPUs busy", attrs={"td": {"data-column": "gpus-busy"}})
    gpus_faulty = tables.Column(verbose_name="GPUs faulty", attrs={"td": {"data-column": "gpus-faulty"}})
    nodes_cordoned = tables.Column(
        verbose_name="Nodes cordoned", attrs={"td": {"data-column": "nodes-cordoned"}}
    )
    fabric = tables.Column(empty_values=(), orderable=False, verbose_name="Fabric")

    class Meta(ClusterTable.Meta):
        fields = (
            *ClusterTable.Meta.fields,
            "nodes",
            "gpus",
            "gpus_busy",
            "gpus_faulty",
            "nodes_cordoned",
            "fabric",
        )
        sequence = fields
        empty_text = "No clusters you can see."

    def render_gpus_faulty(self, value):
        return format_html('<span class="{}">{}</span>', "bad" if value else "muted", number(value))

    def render_fabric(self, record):
        return format_html('<a href="{}">Fabric of {}</a>', reverse("fabric", args=[record.pk]), record.name)


class NodeTable(tables.Table):
    hostname = tables.Column(linkify=("node-detail", {"pk": tables.A("pk")}))
    gpus = tables.Column(accessor="gpu_count", verbose_name="GPUs")
    leaf_switch = tables.Column(verbose_name="Leaf switch")
    gpu_model = tables.Column(verbose_name="GPU model")
    risk_score = tables.Column(verbose_name="Risk")
    state_reason = tables.Column(verbose_name="Why")

    def render_risk_score(self, value):
        return number(value, 2)

    class Meta:
        model = Node
        attrs = ATTRS
        fields = (
            "hostname",
            "state",
            "rack",
            "leaf_switch",
            "gpu_model",
            "gpus",
            "risk_score",
            "state_reason",
        )
        sequence = fields
        per_page = 100


class RolloutTable(tables.Table):
    id = tables.Column(linkify=("fleet-rollout", {"pk": tables.A("pk")}), verbose_name="Rollout")
    version = tables.Column(accessor="version__number", verbose_name="Version")
    blueprint = tables.Column(accessor="version__blueprint__name", verbose_name="Blueprint")

    class Meta:
        model = Rollout
        attrs = ATTRS
        fields = (
            "id",
            "blueprint",
            "version",
            "state",
            "current_batch",
            "reason",
            "created_at",
            "finished_at",
        )
        sequence = fields
        per_page = 50

    def render_id(self, value):
        return f"#{value}"

    def render_current_batch(self, value):
        return "—" if value is None or value < 0 else str(value + 1)

    def render_created_at(self, value):
        return when(value)

    def render_finished_at(self, value):
        return when(value)


class DriftFindingTable(tables.Table):
    cluster = tables.Column(
        accessor="cluster__name", linkify=("fleet-cluster", {"pk": tables.A("cluster_id")})
    )
    diff = tables.Column(orderable=False)

    class Meta:
        model = DriftFinding
        attrs = ATTRS
        fields = (
            "cluster",
            "addon",
            "kind",
            "diff",
            "detected_at",
            "resolved_at",
            "resolution",
            "correction_attempts",
            "gave_up_at",
        )
        sequence = fields
        per_page = 50

    def render_diff(self, value):
        return format_html_join_diff(value)

    def render_resolution(self, record, value):
        return getattr(self, "resolution_labels", {}).get(record.pk, value)

    def render_detected_at(self, value):
        return when(value)

    def render_resolved_at(self, value):
        return when(value)

    def render_gave_up_at(self, value):
        return when(value)


def format_html_join_diff(changes) -> str:
    from django.utils.html import format_html_join

    return format_html_join(
        "",
        '<div class="diff"><code>{}</code> {} <span class="desired">{}</span> → <span class="observed">{}</span></div>',
        (
            (c.get("path") or "·", c.get("op"), c.get("desired", "—"), c.get("observed", "—"))
            for c in changes or []
        ),
    )
