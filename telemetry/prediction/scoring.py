"""Scoring detected intervals against labelled windows, as Orion's benchmark does (overlapping segments).

Each labelled window that overlaps at least one detected interval is a true positive, each window no detection
overlaps a false negative, each detected interval that overlaps no window a false positive. Intervals are
closed: touching counts as overlapping (Orion pads each end by one before its strict test, which comes to the
same on whole-second timestamps).
"""

from dataclasses import dataclass

Interval = tuple[float, float]


def overlaps(a: Interval, b: Interval) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def overlap_segment(expected: list[Interval], observed: list[Interval]) -> tuple[int, int, int]:
    """(tp, fp, fn) of ``observed`` intervals against ``expected`` windows."""
    tp = fn = 0
    matched: set[int] = set()
    for window in expected:
        hits = [i for i, interval in enumerate(observed) if overlaps(window, interval)]
        if hits:
            tp += 1
            matched.update(hits)
        else:
            fn += 1
    return tp, len(observed) - len(matched), fn


@dataclass
class Scores:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    def __iadd__(self, other: "Scores") -> "Scores":
        self.tp, self.fp, self.fn = self.tp + other.tp, self.fp + other.fp, self.fn + other.fn
        return self

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> float | None:
        if self.tp + self.fp + self.fn == 0:
            return None
        return 2 * self.tp / (2 * self.tp + self.fp + self.fn)


def first_starts(expected: list[Interval], observed: list[Interval]) -> list[float | None]:
    """Per window: the start of the first detection overlapping it, or None."""
    starts = [[interval[0] for interval in observed if overlaps(window, interval)] for window in expected]
    return [min(found) if found else None for found in starts]


def lead_times(expected: list[Interval], labels: list[float], observed: list[Interval]) -> list[float | None]:
    """Per window: its labelled anomaly time minus the start of the first detection overlapping it, in seconds
    (positive: detected early), or None when nothing overlaps it. ``labels`` pair with ``expected`` in order
    (NAB lists one label per window, not always inside it); when the counts differ, a label inside the window is
    taken, else the window's middle."""
    leads: list[float | None] = []
    for i, window in enumerate(expected):
        if len(labels) == len(expected):
            label = labels[i]
        else:
            inside = [t for t in labels if window[0] <= t <= window[1]]
            label = inside[0] if inside else (window[0] + window[1]) / 2
        starts = [interval[0] for interval in observed if overlaps(window, interval)]
        leads.append(label - min(starts) if starts else None)
    return leads
