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
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from telemetry.prediction.detector import CONFIG, DetectorConfig, StreamingDetector, alarm_intervals
from telemetry.prediction.scoring import Scores, lead_times, overlap_segment

PROBATION = 0.15   # NAB: the first 15 % of a series is for learning only
HOUR = 3600.0


def _grid(**channels) -> list[DetectorConfig]:
    """One family's candidates, simplest first (ties go to the earlier one): the memory (a week or two), where an
    excursion starts (3 or 4 spreads) and how long an alarm is held (8 h, or the prediction horizon's 24 h)."""
    return [replace(CONFIG, memory_blocks=memory, z_min=z_min, hold_seconds=hold, **channels)
            for memory in (168, 336) for z_min in (4.0, 3.0) for hold in (8 * HOUR, 24 * HOUR)]


# The families compared (bench/predictor_nab.py --compare), each with its parameters chosen inside the fold; the
# extra channels join the core's as an ensemble (an alarm on any channel is the detector's alarm).
FAMILIES = {
    "excursions (reading and hourly level)": _grid(),
    "+ seasonal profile (same hour, past days)": _grid(seasonal="profile"),
    "+ seasonal-trend decomposition (statsmodels STL)": _grid(seasonal="stl"),
    "+ matrix-profile discord (stumpy MASS, 6 h)": _grid(discord_blocks=6),
    "+ seasonal profile + discord": _grid(seasonal="profile", discord_blocks=6),
}
SHIPPED = "excursions (reading and hourly level)"


CANDIDATES = FAMILIES[SHIPPED]   # the family the product ships, chosen by held-out F1 (docs/prediction.md)


@dataclass
class Series:
    key: str                 # "<folder>/<file>.csv"
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
    leads: list[float | None] = field(default_factory=list)   # per window, seconds (positive: early)

    @property
    def found_leads(self) -> list[float]:
        return [lead for lead in self.leads if lead is not None]


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


def load(data: Path, windows_path: Path, labels_path: Path | None = None,
         folders: list[str] | None = None) -> list[Series]:
    """Every ``timestamp,value`` CSV under ``data`` that the windows file keys as ``<folder>/<file>.csv``."""
    windows = json.loads(windows_path.read_text())
    labels = json.loads(labels_path.read_text()) if labels_path and labels_path.exists() else {}
    corpus = []
    for key in sorted(windows):
        if (data / key).is_file() and (folders is None or key.split("/", 1)[0] in folders):
            timestamps, values = read_series(data / key)
            corpus.append(Series(key, timestamps, values, [(parse_time(a), parse_time(b)) for a, b in windows[key]],
                                 [parse_time(t) for t in labels.get(key, [])]))
    return corpus


def detect(config: DetectorConfig, series: Series) -> list[tuple[float, float]]:
    """The detected intervals: runs of alarmed readings, streamed one by one (learning only while on probation)."""
    detector = StreamingDetector(config)
    learn_until = int(PROBATION * len(series.values))
    alarms = [detector.update(ts, value, detect=i >= learn_until).alarm
              for i, (ts, value) in enumerate(zip(series.timestamps, series.values, strict=True))]
    return alarm_intervals(series.timestamps, alarms)


def score(config: DetectorConfig, series: Series) -> Result:
    observed = detect(config, series)
    return Result(Scores(*overlap_segment(series.windows, observed)), lead_times(series.windows, series.labels, observed))


def _score_all(job: tuple[list[DetectorConfig], Series]) -> list[Result]:
    configs, series = job
    return [score(config, series) for config in configs]


def score_matrix(configs: list[DetectorConfig], corpus: list[Series], *, processes: int | None = None
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


def _rank(results: list[Result]) -> tuple[float, float]:
    """What a candidate is chosen by: summed F1, then (at the same F1 to 0.01) the median lead time."""
    f1 = total(results).f1 or 0.0
    leads = [lead for result in results for lead in result.found_leads]
    return round(f1, 2), statistics.median(leads) if leads else -1e18


def choose(matrix: list[list[Result]], series: list[int]) -> int:
    """The candidate with the best summed F1 on these series (then the earliest warning, then the simplest)."""
    best, best_rank = 0, None
    for c, row in enumerate(matrix):
        rank = _rank([row[s] for s in series])
        if best_rank is None or rank > best_rank:
            best, best_rank = c, rank
    return best


@dataclass
class Fold:
    series: int          # the held-out series' index
    chosen: int          # the candidate chosen on the others
    result: Result       # that candidate on the held-out series


def leave_one_out(matrix: list[list[Result]]) -> list[Fold]:
    count = len(matrix[0])
    folds = []
    for held in range(count):
        chosen = choose(matrix, [s for s in range(count) if s != held])
        folds.append(Fold(held, chosen, matrix[chosen][held]))
    return folds
