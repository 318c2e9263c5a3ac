"""How every page writes its figures: numbers with thousands separators, shares as percentages, and one date
format. Templates ``{% load figures %}`` and use these instead of ``floatformat`` and ``date``, so a figure
reads the same on every page; static/js/live.js writes times in the same format in the reader's time zone."""

import datetime
import math

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"  # live.js formatTime() writes the same, in the browser's time zone
DASH = "—"


def _number(value) -> float | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


@register.filter
def number(value, digits=0):
    """``2595014.2|number:1`` → ``2,595,014.2``; an integer stays whole (``2304|number`` → ``2,304``); None → —."""
    found = _number(value)
    if found is None:
        return DASH
    digits = max(0, int(digits))
    if round(found, digits) == 0:
        found = 0.0  # no "-0.0"
    return f"{found:,.{digits}f}"


@register.filter
def percent(fraction, digits=1):
    """A share written as a percentage: ``0.9901|percent`` → ``99.0 %``; None → —."""
    found = _number(fraction)
    if found is None:
        return DASH
    return f"{found * 100:,.{max(0, int(digits))}f} %"


@register.filter
def when(value):
    """A moment as ``<time>`` in the one date format (UTC here; live.js rewrites it in the reader's zone)."""
    if not value:
        return DASH
    value = _utc(value)
    if isinstance(value, datetime.datetime):
        return format_html('<time datetime="{}">{}</time>', value.isoformat(), value.strftime(DATE_FORMAT))
    return value


def _utc(value):
    """A moment (a datetime, or an ISO string of one; naive is UTC) in UTC; anything else as it came."""
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime.datetime):
        if timezone.is_naive(value):
            value = timezone.make_aware(value, datetime.UTC)
        return value.astimezone(datetime.UTC)
    return value


@register.filter
def ordinal_batch(index):
    """Batches are stored from 0 and shown from 1; a negative index (none in flight yet) is —."""
    try:
        index = int(index)
    except (TypeError, ValueError):
        return DASH
    return DASH if index < 0 else str(index + 1)


@register.simple_tag
def chart_summary(points, unit: str, cumulative: bool = False, value: str = "v", at: str = "t") -> str:
    """A chart's text alternative: what a reader of a series of ``{"t": iso time, "v": value}`` points would
    see in it (the screen reader's copy of the chart, in a visually hidden paragraph beside it)."""
    rows = [row for row in points or [] if _number(row.get(value)) is not None]
    if not rows:
        return f"No {unit}s in this range."

    def stamp(row):
        return _plain_time(row[at])

    if cumulative:
        return (
            f"{number(rows[-1][value], 2)} {unit}s in all, rising over {len(rows)} step{'s' * (len(rows) != 1)} "
            f"from {stamp(rows[0])} to {stamp(rows[-1])}."
        )
    total = sum(_number(row[value]) for row in rows)
    peak = max(rows, key=lambda row: _number(row[value]))
    return (
        f"{number(total)} {unit}{'s' * (total != 1)} in {len(rows)} interval{'s' * (len(rows) != 1)} from "
        f"{stamp(rows[0])} to {stamp(rows[-1])}; the most, {number(peak[value])}, at {stamp(peak)}."
    )


def _plain_time(value) -> str:
    """A moment as text (UTC), for text alternatives (no markup)."""
    value = _utc(value)
    if isinstance(value, datetime.datetime):
        return value.strftime(DATE_FORMAT) + " UTC"
    return str(value)
