"""The failure predictor's anomaly detector, offline, on labelled series (NAB), scored as Orion scores.

    .venv/bin/python bench/predictor_nab.py                       # realAWSCloudwatch and realKnownCause
    .venv/bin/python bench/predictor_nab.py --data DIR --windows FILE [--labels FILE] [--orion FILE]

Every ``timestamp,value`` CSV under DIR that the windows file keys as ``<folder>/<file>.csv`` is streamed
through ``telemetry.prediction.detector.StreamingDetector`` with the one configuration it ships with (nothing
here is chosen per series or per file). As NAB prescribes, the first 15 % of each series is a probationary
period: the detector learns from it but raises nothing there. Detected intervals are runs of alarmed readings,
scored by overlapping segments (``telemetry.prediction.scoring``). Printed: per series and summed tp, fp, fn,
precision, recall and F1; the lead time of each detection (labelled anomaly time minus the start of the first
detection overlapping its window; positive means early); and, where the Orion results file has the series,
TadGAN's sums beside ours.
"""

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from telemetry.prediction.detector import CONFIG, StreamingDetector, alarm_intervals  # noqa: E402
from telemetry.prediction.scoring import Scores, lead_times, overlap_segment  # noqa: E402

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "anomaly"
PROBATION = 0.15   # NAB: the first 15 % of a series is for learning only


def parse_time(text: str) -> float:
    """NAB's timestamps carry no zone: read as UTC, so no daylight-saving step lands in a series."""
    moment = datetime.fromisoformat(text.strip())
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def read_series(path: Path) -> tuple[list[float], list[float]]:
    timestamps, values = [], []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"timestamp", "value"} <= set(reader.fieldnames):
            raise SystemExit(f"{path}: expected a timestamp,value CSV")
        for row in reader:
            timestamps.append(parse_time(row["timestamp"]))
            values.append(float(row["value"]))
    return timestamps, values


def detect(timestamps: list[float], values: list[float]) -> list[tuple[float, float]]:
    detector = StreamingDetector(CONFIG)
    learn_until = int(PROBATION * len(values))
    alarms = [detector.update(ts, value, detect=i >= learn_until).alarm
              for i, (ts, value) in enumerate(zip(timestamps, values, strict=True))]
    return alarm_intervals(timestamps, alarms)


def orion_sums(path: Path, pipeline: str, signals: set[str]) -> tuple[Scores, set[str]] | None:
    if not path.exists():
        return None
    total, found = Scores(), set()
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["pipeline"] == pipeline and row["signal"] in signals:
                total += Scores(int(row["tp"]), int(row["fp"]), int(row["fn"]))
                found.add(row["signal"])
    return (total, found) if found else None


def fmt(value: float | None) -> str:
    return "   -" if value is None else f"{value:.3f}"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:+.1f} h"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA, help="folder holding <folder>/<file>.csv series")
    parser.add_argument("--windows", type=Path, default=None, help="NAB windows JSON (default: DATA/windows.json)")
    parser.add_argument("--labels", type=Path, default=None, help="NAB labels JSON (default: DATA/labels.json)")
    parser.add_argument("--orion", type=Path, default=None,
                        help="Orion results CSV (default: DATA/orion_scores_realAWSCloudwatch.csv)")
    parser.add_argument("--corpus", action="append", default=None,
                        help="only these folders (repeatable; default: every folder with series under DATA)")
    args = parser.parse_args()
    windows_path = args.windows or args.data / "windows.json"
    labels_path = args.labels or args.data / "labels.json"
    orion_path = args.orion or args.data / "orion_scores_realAWSCloudwatch.csv"
    try:
        windows = json.loads(windows_path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot read the windows file {windows_path}: {error}") from error
    labels = json.loads(labels_path.read_text()) if labels_path.exists() else {}

    by_corpus: dict[str, list[str]] = defaultdict(list)
    for key in sorted(windows):
        folder = key.split("/", 1)[0]
        if (args.data / key).is_file() and (args.corpus is None or folder in args.corpus):
            by_corpus[folder].append(key)
    if not by_corpus:
        raise SystemExit(f"no series under {args.data} is keyed in {windows_path}")

    print(f"detector: {CONFIG}")
    print(f"probationary period: first {PROBATION:.0%} of each series (learning only)\n")
    started = time.perf_counter()
    readings = 0
    for corpus, keys in by_corpus.items():
        total = Scores()
        all_leads: list[float] = []
        print(f"== {corpus} ({len(keys)} series)")
        print(f"{'series':44s} {'tp':>3s} {'fp':>3s} {'fn':>3s} {'prec':>6s} {'recall':>6s} {'F1':>6s}  lead time per window")
        for key in keys:
            timestamps, values = read_series(args.data / key)
            readings += len(values)
            expected = [(parse_time(a), parse_time(b)) for a, b in windows[key]]
            label_times = [parse_time(t) for t in labels.get(key, [])]
            observed = detect(timestamps, values)
            score = Scores(*overlap_segment(expected, observed))
            total += score
            leads = lead_times(expected, label_times, observed)
            all_leads += [lead for lead in leads if lead is not None]
            lead_text = ", ".join("missed" if lead is None else hours(lead) for lead in leads) or "(no window)"
            name = key.split("/", 1)[1]
            print(f"{name[:44]:44s} {score.tp:3d} {score.fp:3d} {score.fn:3d} {fmt(score.precision):>6s} "
                  f"{fmt(score.recall):>6s} {fmt(score.f1):>6s}  {lead_text}")
        print(f"{'SUM':44s} {total.tp:3d} {total.fp:3d} {total.fn:3d} {fmt(total.precision):>6s} "
              f"{fmt(total.recall):>6s} {fmt(total.f1):>6s}")
        if all_leads:
            print(f"lead time of detections: median {hours(statistics.median(all_leads))}, "
                  f"earliest {hours(max(all_leads))}, latest {hours(min(all_leads))}")
        signals = {Path(key).stem for key in keys}
        orion = orion_sums(orion_path, "tadgan", signals)
        if orion:
            tadgan, found = orion
            missing = signals - found
            print(f"TadGAN (Orion) on the same series: tp {tadgan.tp} fp {tadgan.fp} fn {tadgan.fn}  "
                  f"precision {fmt(tadgan.precision)} recall {fmt(tadgan.recall)} F1 {fmt(tadgan.f1)}"
                  + (f"  (Orion lacks {len(missing)} series)" if missing else ""))
            if tadgan.f1 and total.f1 is not None:
                verdict = "beats" if total.f1 > tadgan.f1 else ("ties" if total.f1 == tadgan.f1 else "trails")
                print(f"this detector {verdict} TadGAN: F1 {total.f1:.3f} vs {tadgan.f1:.3f} "
                      f"(difference {total.f1 - tadgan.f1:+.3f}, ratio {total.f1 / tadgan.f1:.3f})")
        else:
            print("TadGAN (Orion): no results for these series")
        print()
    elapsed = time.perf_counter() - started
    print(f"{readings:,} readings in {elapsed:.1f} s ({readings / elapsed:,.0f} readings/s, one core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
