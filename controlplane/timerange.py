"""The time range of a page's charts: ``?range=15m|6h|7d|30d``, read once by the view, which filters the charts'
data by it. A value that is not one of these is ignored for the page's default (a chart's range is a view
setting, not a query to refuse). The picker (templates/_time_range.html) links to each range with the page's
other query parameters kept; static/js/time_range.js remembers the last one chosen per page."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

# key -> (label, span, the bucket charts of counts use at this range)
RANGES = {
    "15m": ("15 min", timedelta(minutes=15), "minute"),
    "6h": ("6 h", timedelta(hours=6), "minute"),
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


def time_range(request, *, default: str = "7d") -> TimeRange:
    """The range the request asks for (the default where it names none, or one that is not offered), with the
    picker's links."""
    asked = request.GET.get(PARAMETER, "")
    key = asked if asked in RANGES else default
    options = []
    for option, (label, _, _) in RANGES.items():
        query = request.GET.copy()
        query[PARAMETER] = option
        query.pop("page", None)  # another window is another list: start from its first page
        options.append(
            {"key": option, "label": label, "href": "?" + query.urlencode(), "current": option == key}
        )
    return TimeRange(key=key, now=timezone.now(), options=tuple(options))
