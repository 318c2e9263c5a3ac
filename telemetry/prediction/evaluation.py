"""Choosing the detector by how it does on series it has not seen: leave-one-series-out over labelled series.

Pure Python (no Django), shared by ``bench/predictor_nab.py`` and the suite's held-out test. Every candidate
configuration in ``CANDIDATES`` is streamed over every series once (as the product streams a node's series:
``StreamingDetector.update`` per reading, learning only during NAB's probationary period); then for each series
in turn the candidate with the best summed F1 on the *other* series is chosen and scored on the one held out.
The held-out figures are the sums of those scores. ``choose`` on every series gives the one configuration the
product ships (``detector.CONFIG``) and ``--data`` applies unchanged.
"""

import csv
import json
import math
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from telemetry.prediction.detector import CONFIG, DetectorConfig, StreamingDetector, alarm_intervals
from telemetry.prediction.scoring import Scores, first_starts, lead_times, overlap_segment

PROBATION = 0.15  # NAB: the first 15 % of a series is for learning only
HOUR = 3600.0


def _grid(**channels) -> list[DetectorConfig]:
    """One family's candidates, simplest first (ties go to the earlier one): the memory (a week or two), where an
    excursion starts (3 or 2.5 spreads) and how long an alarm is held (8 h, or the prediction horizon's 24 h); the
    family's channels as ``channels`` say (the slow level is off unless they switch it on)."""
    channels = {"slow": False} | channels
    return [
        replace(CONFIG, memory_blocks=memory, z_min=z_min, hold_seconds=hold, **channels)
        for memory in (168, 336)
        for z_min in (3.0, 2.5)
        for hold in (8 * HOUR, 24 * HOUR)
    ]


# The families compared (bench/predictor_nab.py --compare), each with its parameters chosen inside the fold; the
# extra channels join the core's as an ensemble (an alarm on any channel is the detector's alarm).
FAMILIES = {
    "excursions (reading and hourly level)": _grid(),
    "+ slow level (the hour against the whole memory's median)": _grid(slow=True),
    "+ trend (the level 6 h ahead at the last 6 h's slope)": _grid(trend_blocks=6),
    "+ drift (CUSUM of deviations beyond 2 spreads, from 4 spread-hours)": _grid(drift_k=2.0, drift_h=4.0),
    "+ seasonal profile (same hour, past days)": _grid(seasonal="profile"),
    # a week's memory cannot hold two weeks: its candidates run without the channel
    "+ weekly profile (same hour of the week, one and two weeks back)": _grid(slow=True, seasonal="weekly"),
    "+ matrix-profile discord (stumpy MASS, 6 h)": _grid(discord_blocks=6),
    "+ change point (ruptures Binseg, last 48 h)": _grid(library="ruptures"),
    "+ half-space trees (river)": _grid(library="half_space_trees"),
    "+ Page-Hinkley drift (river)": _grid(library="page_hinkley"),
    "+ ADWIN drift (river)": _grid(library="adwin"),
    # 394 s with the earlier eight candidates: only with --family (docs/prediction.md)
    "+ seasonal-trend decomposition (statsmodels STL)": _grid(seasonal="stl"),
}
SLOW_FAMILIES = ("+ seasonal-trend decomposition (statsmodels STL)",)
SHIPPED = "+ slow level (the hour against the whole memory's median)"


CANDIDATES = FAMILIES[SHIPPED]  # the family the product ships, chosen by held-out F1 (docs/prediction.md)
# Among the candidates whose summed F1 is within this of the best, the one that warns earliest (the highest median
# lead time) is chosen: about one more error in the thirty-two windows' worth of F1 (issue 21, part 2)
F1_MARGIN = 0.02


@dataclass
class Series:
    key: str  # "<folder>/<file>.csv"
    timestamps: list[float]
    values: list[float]
    windows: list[tuple[float, float]]
    labels: list[float]

    @property
    def folder(self) -> str:
        return self.key.split("/", 1)[0]


@dataclass
class Result:
    scores: Scores
    leads: list[float | None] = field(default_factory=list)  # per window, seconds (positive: early)
    # per window: True when the first detection overlapping it began before the window opened (raised by something
    # earlier and still standing: the hold, or a long excursion), False when it began inside, None when none did
    held: list[bool | None] = field(default_factory=list)

    @property
    def found_leads(self) -> list[float]:
        return [lead for lead in self.leads if lead is not None]

    @property
    def early(self) -> tuple[int, int]:
        """How many windows were detected before their label: (by an alarm raised before the window opened, by
        one raised inside the window)."""
        pairs = [(lead, held) for lead, held in zip(self.leads, self.held, strict=True) if lead is not None]
        return sum(lead > 0 and held for lead, held in pairs), sum(
            lead > 0 and not held for lead, held in pairs
        )


def parse_time(text: str) -> float:
    """NAB's timestamps carry no zone: read as UTC, so no daylight-saving step lands in a series."""
    moment = datetime.fromisoformat(text.strip())
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def read_series(path: Path) -> tuple[list[float], list[float]]:
    timestamps, values = [], []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"timestamp", "value"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: expected a timestamp,value CSV")
        for row in reader:
            timestamps.append(parse_time(row["timestamp"]))
            values.append(float(row["value"]))
    return timestamps, values


def load(
    data: Path, windows_path: Path, labels_path: Path | None = None, folders: list[str] | None = None
) -> list[Series]:
    """Every ``timestamp,value`` CSV under ``data`` that the windows file keys as ``<folder>/<file>.csv``."""
    windows = json.loads(windows_path.read_text())
    labels = json.loads(labels_path.read_text()) if labels_path and labels_path.exists() else {}
    corpus = []
    for key in sorted(windows):
        if (data / key).is_file() and (folders is None or key.split("/", 1)[0] in folders):
            timestamps, values = read_series(data / key)
            corpus.append(
                Series(
                    key,
                    timestamps,
                    values,
                    [(parse_time(a), parse_time(b)) for a, b in windows[key]],
                    [parse_time(t) for t in labels.get(key, [])],
                )
            )
    return corpus


def detect(config: DetectorConfig, series: Series) -> list[tuple[float, float]]:
    """The detected intervals: runs of alarmed readings, streamed one by one (learning only while on probation)."""
    detector = StreamingDetector(config)
    learn_until = int(PROBATION * len(series.values))
    alarms = [
        detector.update(ts, value, detect=i >= learn_until).alarm
        for i, (ts, value) in enumerate(zip(series.timestamps, series.values, strict=True))
    ]
    return alarm_intervals(series.timestamps, alarms)


def score(config: DetectorConfig, series: Series) -> Result:
    observed = detect(config, series)
    held = [
        None if start is None else start < window[0]
        for window, start in zip(series.windows, first_starts(series.windows, observed), strict=True)
    ]
    return Result(
        Scores(*overlap_segment(series.windows, observed)),
        lead_times(series.windows, series.labels, observed),
        held,
    )


def _score_all(job: tuple[list[DetectorConfig], Series]) -> list[Result]:
    configs, series = job
    return [score(config, series) for config in configs]


def score_matrix(
    configs: list[DetectorConfig], corpus: list[Series], *, processes: int | None = None
) -> list[list[Result]]:
    """``[candidate][series]`` results; series are spread over ``processes`` (default: the CPUs this process
    may use, at most 4)."""
    processes = processes or min(4, len(os.sched_getaffinity(0)))
    jobs = [(configs, series) for series in corpus]
    if processes > 1 and len(corpus) > 1:
        with ProcessPoolExecutor(processes) as pool:
            by_series = list(pool.map(_score_all, jobs))
    else:
        by_series = [_score_all(job) for job in jobs]
    return [[by_series[s][c] for s in range(len(corpus))] for c in range(len(configs))]


def total(results: list[Result]) -> Scores:
    summed = Scores()
    for result in results:
        summed += result.scores
    return summed


def median_lead(results: list[Result]) -> float:
    """The median lead time (seconds) of these results' detections; minus infinity without any."""
    leads = [lead for result in results for lead in result.found_leads]
    return statistics.median(leads) if leads else -math.inf


def choose(matrix: list[list[Result]], series: list[int]) -> int:
    """Among the candidates whose summed F1 on these series is within ``F1_MARGIN`` of the best, the one with the
    latest median lead time (the earliest warning); at the same lead, the best F1, then the simplest (the first)."""
    f1 = [total([row[s] for s in series]).f1 or 0.0 for row in matrix]
    near = [c for c in range(len(matrix)) if f1[c] >= max(f1) - F1_MARGIN - 1e-12]
    leads = {c: median_lead([matrix[c][s] for s in series]) for c in near}
    return max(near, key=lambda c: (leads[c], f1[c], -c))


@dataclass
class Fold:
    series: int  # the held-out series' index
    chosen: int  # the candidate chosen on the others
    result: Result  # that candidate on the held-out series


def leave_one_out(matrix: list[list[Result]]) -> list[Fold]:
    count = len(matrix[0])
    folds = []
    for held in range(count):
        chosen = choose(matrix, [s for s in range(count) if s != held])
        folds.append(Fold(held, chosen, matrix[chosen][held]))
    return folds
