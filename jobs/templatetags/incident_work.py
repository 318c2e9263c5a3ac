"""The incident page's on-call work card (acknowledge, assign, notes, resolve, reopen; the times) and the filters
it needs: notes in Markdown, rendered with raw HTML off (markdown-it-py; its link check drops javascript: and
data: URLs), and time spans in words."""

from django import template
from django.utils.safestring import mark_safe
from markdown_it import MarkdownIt

from controlplane.access import principal
from controlplane.selectors import topic_seq
from jobs import selectors
from jobs.forms_incidents import AssignForm, NoteForm, ResolveForm
from jobs.services.incident_work import may_annotate, may_work
from jobs.tables import took as took_words

register = template.Library()

# CommonMark with tables and strikethrough; "html": False shows any HTML in a note as text.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


@register.filter
def markdown(text: str) -> str:
    """A note's Markdown as HTML, raw HTML escaped (safe to put on the page as it is)."""
    return mark_safe(_MARKDOWN.render(text or ""))  # noqa: S308 - markdown-it escapes all HTML with html off


@register.filter
def took(seconds) -> str:
    return took_words(seconds)


def live_topic(user) -> dict:
    """The topic a reader's incident pages follow (the fleet's for provider roles, the tenant's otherwise) and
    its sequence number now: what the page's data-live-topics and data-live-after carry."""
    from jobs.views import _feed_topic

    topic = _feed_topic(principal(user))
    return {"live_topic": topic, "live_after": topic_seq(topic) if topic else 0}


def _assignee_name(who, incident) -> str | None:
    """Who it is assigned to, as the reader may know it: a tenant user reads the name of a provider user or of
    a user of its own tenant, and only that someone else has it otherwise."""
    assignee = incident.assignee
    if assignee is None:
        return None
    if who.is_provider:
        return assignee.username
    theirs = principal(assignee)
    return (
        assignee.username
        if theirs.is_provider or theirs.tenant_id == who.tenant_id
        else "a user of another tenant"
    )


@register.inclusion_tag("jobs/_incident_work.html", takes_context=True)
def incident_work_card(context, incident):
    user = context["request"].user
    who = principal(user)
    working = may_work(user)
    card = {
        "incident": incident,
        "who": who,
        "may_work": working,
        "may_annotate": may_annotate(user),
        "times": selectors.incident_times(incident),
        "notes": list(selectors.incident_notes(user=user, incident=incident)),
        "assignee_name": _assignee_name(who, incident),
        "recovering": selectors.incident_recovering(incident=incident),
        "note_form": NoteForm(auto_id="note-%s"),
        "csrf_token": context.get("csrf_token"),
        **live_topic(user),
    }
    if working:
        card["assign_form"] = AssignForm(
            assignees=selectors.incident_assignees(incident=incident),
            initial={"user": incident.assignee_id},
            auto_id="assign-%s",
        )
        card["resolve_form"] = ResolveForm(auto_id="resolve-%s")
    return card
