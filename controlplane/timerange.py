"""The time range of a page's charts: ``?range=15m|1h|6h|24h|7d|30d``, read once by the view, which filters the
charts' data by it. A value that is not one of these is ignored for the page's default (a chart's range is a view
setting, not a query to refuse). A page's default may fit its data (``fitting``): a new fleet's charts open on its
first hour, not on one spike at the edge of 7 days. The picker (templates/_time_range.html) links to each range
with the page's other query parameters kept; static/js/time_range.js remembers the last one chosen per page."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

# key -> (label, span, the bucket charts of counts use at this range)
RANGES = {
    "15m": ("15 min", timedelta(minutes=15), "minute"),
    "1h": ("1 h", timedelta(hours=1), "minute"),
    "6h": ("6 h", timedelta(hours=6), "minute"),
    "24h": ("24 h", timedelta(hours=24), "hour"),
    "7d": ("7 d", timedelta(days=7), "hour"),
    "30d": ("30 d", timedelta(days=30), "day"),
}
PARAMETER = "range"


@dataclass(frozen=True)
class TimeRange:
    key: str
    now: datetime
    options: tuple[dict, ...] = ()

    @property
    def label(self) -> str:
        return RANGES[self.key][0]

    @property
    def span(self) -> timedelta:
        return RANGES[self.key][1]

    @property
    def bucket(self) -> str:
        """minute, hour or day: what a count per bucket is counted per."""
        return RANGES[self.key][2]

    @property
    def since(self) -> datetime:
        return self.now - self.span

    def as_data(self) -> dict:
        """What a chart's script needs: the window's edges and its bucket."""
        return {
            "key": self.key,
            "label": self.label,
            "since": self.since.isoformat(),
            "until": self.now.isoformat(),
            "bucket": self.bucket,
        }


def fitting(
    first: datetime | None, *, now: datetime, keys: tuple[str, ...] = ("1h", "6h", "24h", "7d")
) -> str:
    """The smallest of ``keys`` (shortest first) whose window reaches back to ``first``, the moment the page's data
    begins: the default that shows all of a young fleet's or job's data, and no more. The smallest where there is
    no data yet, the largest where the data is older than every window."""
    if first is None:
        return keys[0]
    for key in keys:
        if now - RANGES[key][1] <= first:
            return key
    return keys[-1]


def time_range(request, *, default: str | Callable[[datetime], str] = "7d") -> TimeRange:
    """The range the request asks for (the default where it names none, or one that is not offered), with the
    picker's links. ``default`` may be a function of now (``fitting`` a query's answer), called only when needed."""
    now = timezone.now()
    asked = request.GET.get(PARAMETER, "")
    if asked in RANGES:
        key = asked
    else:
        key = default(now) if callable(default) else default
    options = []
    for option, (label, _, _) in RANGES.items():
        query = request.GET.copy()
        query[PARAMETER] = option
        query.pop("page", None)  # another window is another list: start from its first page
        options.append(
            {"key": option, "label": label, "href": "?" + query.urlencode(), "current": option == key}
        )
    return TimeRange(key=key, now=now, options=tuple(options))
