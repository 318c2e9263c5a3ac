import functools
import json

import django_tables2 as tables
from django.apps import apps
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from controlplane.models import AuditEntry

# object_type (an audited model's label) -> the page of one such object, by its id. Controlplane imports no app:
# the pages are reached by URL name.
OBJECT_PAGES = {
    "fleet.cluster": "fleet-cluster",
    "fleet.node": "node-detail",
    "fleet.blueprint": "fleet-blueprint",
    "fleet.rollout": "fleet-rollout",
    "jobs.job": "job-detail",
    "jobs.incident": "incident-detail",
    "simulator.whatifrun": "whatif-detail",
    "simulator.scenario": "scenario-detail",
}


@functools.cache
def object_kind(object_type: str) -> str:
    """``fleet.blueprintversion`` -> ``blueprint version``: the model's verbose name, as a reader calls the
    thing (the label's last part where no model has it)."""
    try:
        return str(apps.get_model(object_type)._meta.verbose_name)
    except (LookupError, ValueError):
        return object_type.rsplit(".", 1)[-1].replace("_", " ")


def object_name(entry: AuditEntry) -> str:
    return entry.object_repr or (f"#{entry.object_id}" if entry.object_id else "")


def object_url(entry: AuditEntry) -> str | None:
    name = OBJECT_PAGES.get(entry.object_type)
    if not name or not entry.object_id.isdigit():
        return None
    try:
        return reverse(name, args=[int(entry.object_id)])
    except NoReverseMatch:
        return None


def change_summary(changes) -> str:
    """One line for a change: the fields it touched, old → new where both are short."""
    if not changes:
        return "no details"
    if not isinstance(changes, dict):
        return _short(changes, 80)
    parts = []
    for key, value in changes.items():
        if isinstance(value, list) and len(value) == 2 and all(_scalar(v) for v in value):
            parts.append(f"{key}: {_short(value[0], 24)} → {_short(value[1], 24)}")
        elif _scalar(value):
            parts.append(f"{key}: {_short(value, 32)}")
        else:
            parts.append(key)
    return "; ".join(parts)


def _scalar(value) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _short(value, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class AuditEntryTable(tables.Table):
    """A row per write, one line each: when, who (and through what), what was done to which object (named and
    linked to its page), and the change folded under a summary of it."""

    created_at = tables.DateTimeColumn(verbose_name="When", format="Y-m-d H:i:s")
    actor_name = tables.Column(verbose_name="Who")
    action = tables.Column(verbose_name="What")
    object_repr = tables.Column(verbose_name="Object", orderable=False, empty_values=())
    changes = tables.Column(orderable=False, verbose_name="Change", empty_values=())

    class Meta:
        model = AuditEntry
        attrs = {"class": "table audit-table"}
        fields = ("created_at", "actor_name", "action", "object_repr", "changes")
        order_by = ("-created_at",)
        per_page = 50
        empty_text = (
            "Nothing matches: every write through a page, the API or the command line is recorded here."
        )

    def render_created_at(self, value):
        from controlplane.templatetags.figures import when

        return when(value)

    def render_actor_name(self, value, record):
        through = record.get_source_display().lower() + (
            f" · token {record.token_prefix}…" if record.token_prefix else ""
        )
        name = value or "system"
        return format_html(
            '<span title="{} ({})">{} <span class="muted">({})</span></span>', name, through, name, through
        )

    def render_object_repr(self, record):
        if not record.object_type:
            return "—"
        name, url = object_name(record), object_url(record)
        kind = object_kind(record.object_type)
        if url:
            return format_html(
                '<span class="muted">{}</span> <a href="{}" title="{}">{}</a>', kind, url, name, name
            )
        return format_html('<span class="muted">{}</span> <span title="{}">{}</span>', kind, name, name)

    def render_changes(self, value):
        if not value:
            return format_html('<span class="muted">{}</span>', "—")
        return format_html(
            '<details class="audit-change"><summary>{}</summary><pre>{}</pre></details>',
            change_summary(value),
            json.dumps(value, indent=2, sort_keys=True, default=str),
        )
