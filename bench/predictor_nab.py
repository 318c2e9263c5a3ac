"""The failure predictor's anomaly detector, offline, on labelled series (NAB), scored as Orion scores.

    .venv/bin/python bench/predictor_nab.py                 # leave-one-series-out over the 16 shared series
    .venv/bin/python bench/predictor_nab.py --compare       # ... for every family of detectors tried
    .venv/bin/python bench/predictor_nab.py --compare --family river --family ruptures   # ... for some
    .venv/bin/python bench/predictor_nab.py --data DIR --windows FILE [--labels FILE] [--orion FILE]

With no options: leave-one-series-out over every shared labelled series (``data/anomaly``, both
folders). For each series, the candidate configuration (``telemetry.prediction.evaluation.CANDIDATES``) with the
best summed F1 on the other fifteen is chosen and run on it; the table shows each series as scored by the
configuration chosen without it, the held-out sums per folder and overall (``held-out F1 overall 0.xxx``), the
lead times (and how many detections began before the label: by an alarm already standing when the window opened,
the hold's doing, or by one raised inside the window ahead of the label), and TadGAN's sums from Orion's published
results where they cover the series. ``--compare`` does the same for every family of detectors tried (``--family``
picks some) and prints their held-out F1 and lead times side by side.

With ``--data``: every ``timestamp,value`` CSV under DIR keyed in the windows file as ``<folder>/<file>.csv`` is
streamed through the one configuration chosen on the sixteen shared series (``detector.CONFIG``), unchanged:
nothing is chosen on DIR.

Every series is streamed reading by reading through ``telemetry.prediction.detector.StreamingDetector`` (the
product's detector); as NAB prescribes, the first 15 % of each series is a probationary period (learning only).
Detections are runs of alarmed readings, scored by overlapping segments (``telemetry.prediction.scoring``). The
lead time of a detection is the labelled anomaly time minus the start of the first detection overlapping its
window (positive: early).
"""

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from telemetry.prediction import evaluation  # noqa: E402
from telemetry.prediction.detector import CONFIG  # noqa: E402
from telemetry.prediction.scoring import Scores  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "anomaly"


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


def describe(config) -> str:
    """What differs from the shipped configuration (``detector.CONFIG``)."""
    changed = {k: v for k, v in asdict(config).items() if asdict(CONFIG)[k] != v}
    return "CONFIG" if not changed else "CONFIG with " + ", ".join(f"{k}={v}" for k, v in changed.items())


def lead_summary(results) -> str:
    """The lead times of these results' detections, and where the early ones come from."""
    leads = [lead for result in results for lead in result.found_leads]
    if not leads:
        return "no detection"
    held = sum(result.early[0] for result in results)
    inside = sum(result.early[1] for result in results)
    return (
        f"median {hours(statistics.median(leads))}, mean {hours(statistics.mean(leads))}, "
        f"earliest {hours(max(leads))}, latest {hours(min(leads))}; {held + inside} of {len(leads)} before the "
        f"label: {held} by an alarm raised before the window opened (the hold), {inside} raised inside the "
        f"window ahead of the label"
    )


def table(corpus, results, orion_path: Path, label: str) -> dict[str, Scores]:
    """The per-series table with a SUM line per folder (F1 last); returns the sums per folder and overall."""
    sums: dict[str, Scores] = {}
    by_folder: dict[str, list[int]] = defaultdict(list)
    for i, series in enumerate(corpus):
        by_folder[series.folder].append(i)
    for folder, indices in by_folder.items():
        total = Scores()
        print(f"== {folder} ({len(indices)} series)")
        print(
            f"{'series':44s} {'tp':>3s} {'fp':>3s} {'fn':>3s} {'prec':>6s} {'recall':>6s} {'F1':>6s}  "
            "lead time per window"
        )
        for i in indices:
            series, result = corpus[i], results[i]
            total += result.scores
            lead_text = (
                ", ".join("missed" if lead is None else hours(lead) for lead in result.leads) or "(no window)"
            )
            s = result.scores
            print(
                f"{series.key.split('/', 1)[1][:44]:44s} {s.tp:3d} {s.fp:3d} {s.fn:3d} {fmt(s.precision):>6s} "
                f"{fmt(s.recall):>6s} {fmt(s.f1):>6s}  {lead_text}"
            )
        print(
            f"{'SUM':44s} {total.tp:3d} {total.fp:3d} {total.fn:3d} {fmt(total.precision):>6s} "
            f"{fmt(total.recall):>6s} {fmt(total.f1):>6s}"
        )
        print(f"lead time of detections: {lead_summary([results[i] for i in indices])}")
        print(f"{label}F1 {folder} {fmt(total.f1)}")
        signals = {Path(corpus[i].key).stem for i in indices}
        orion = orion_sums(orion_path, "tadgan", signals)
        if orion:
            tadgan, found = orion
            missing = signals - found
            print(
                f"TadGAN (Orion) on the same series: tp {tadgan.tp} fp {tadgan.fp} fn {tadgan.fn}  "
                f"precision {fmt(tadgan.precision)} recall {fmt(tadgan.recall)} F1 {fmt(tadgan.f1)}"
                + (f"  (Orion lacks {len(missing)} series)" if missing else "")
            )
            if tadgan.f1 and total.f1 is not None:
                verdict = "beats" if total.f1 > tadgan.f1 else ("ties" if total.f1 == tadgan.f1 else "trails")
                print(
                    f"this detector {verdict} TadGAN: F1 {total.f1:.3f} vs {tadgan.f1:.3f} "
                    f"(difference {total.f1 - tadgan.f1:+.3f})"
                )
        else:
            print("TadGAN (Orion): no results for these series")
        print()
        sums[folder] = total
    overall = Scores()
    for total in sums.values():
        overall += total
    sums["overall"] = overall
    print(f"{label}F1 overall {fmt(overall.f1)} (tp {overall.tp} fp {overall.fp} fn {overall.fn})")
    print(f"lead time of all detections: {lead_summary(results)}")
    return sums


def loso(corpus, candidates, orion_path: Path) -> dict[str, Scores]:
    matrix = evaluation.score_matrix(candidates, corpus)
    folds = evaluation.leave_one_out(matrix)
    print(
        f"{len(candidates)} candidate configurations; chosen on each fold's other {len(corpus) - 1} series:"
    )
    counts: dict[int, int] = defaultdict(int)
    for fold in folds:
        counts[fold.chosen] += 1
    for chosen, count in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"  {count:2d} folds: {describe(candidates[chosen])}")
    on_all = evaluation.choose(matrix, list(range(len(corpus))))
    print(
        f"chosen on all {len(corpus)} series (what --data applies and the product ships): "
        f"{describe(candidates[on_all])}\n"
    )
    return table(corpus, [fold.result for fold in folds], orion_path, "held-out ")


def compare(corpus, families: list[str]) -> None:
    rows = []
    for name in families:
        started = time.perf_counter()
        matrix = evaluation.score_matrix(evaluation.FAMILIES[name], corpus)
        folds = evaluation.leave_one_out(matrix)
        sums: dict[str, Scores] = defaultdict(Scores)
        for fold in folds:
            sums[corpus[fold.series].folder] += fold.result.scores
            sums["overall"] += fold.result.scores
        results = [fold.result for fold in folds]
        rows.append((name, sums, results, time.perf_counter() - started))
        print(
            f"{name}: held-out F1 overall {fmt(sums['overall'].f1)}, lead time {lead_summary(results)} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    folders = sorted({series.folder for series in corpus})
    print(
        f"\n| family (parameters chosen inside each fold) | {' | '.join(folders)} | overall | median lead | "
        "before the label (held / inside the window) | time |"
    )
    print(f"| --- | {' | '.join('---' for _ in folders)} | --- | --- | --- | --- |")
    for name, sums, results, seconds in rows:
        cells = [f"{sums[f].tp}/{sums[f].fp}/{sums[f].fn} F1 {fmt(sums[f].f1)}" for f in folders]
        leads = [lead for result in results for lead in result.found_leads]
        median = hours(statistics.median(leads)) if leads else "-"
        held, inside = (sum(result.early[i] for result in results) for i in (0, 1))
        print(
            f"| {name} | {' | '.join(cells)} | **{fmt(sums['overall'].f1)}** | {median} | "
            f"{held + inside} of {len(leads)} ({held} / {inside}) | {seconds:.0f} s |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder holding <folder>/<file>.csv series: "
        "apply the shipped configuration to them, unchanged (default: leave-one-series-out on "
        "the shared series)",
    )
    parser.add_argument(
        "--windows", type=Path, default=None, help="NAB windows JSON (default: DATA/windows.json)"
    )
    parser.add_argument(
        "--labels", type=Path, default=None, help="NAB labels JSON (default: DATA/labels.json)"
    )
    parser.add_argument(
        "--orion",
        type=Path,
        default=None,
        help="Orion results CSV (default: DATA/orion_scores_realAWSCloudwatch.csv)",
    )
    parser.add_argument(
        "--corpus",
        action="append",
        default=None,
        help="only these folders (repeatable; default: every folder with series under DATA)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="leave-one-series-out for every family tried "
        "(but the slow ones: " + "; ".join(evaluation.SLOW_FAMILIES) + ")",
    )
    parser.add_argument(
        "--family",
        action="append",
        default=None,
        help="with --compare: only the families whose name contains this (repeatable; "
        '"all" for every one, the slow ones too)',
    )
    args = parser.parse_args()
    families = [name for name in evaluation.FAMILIES if name not in evaluation.SLOW_FAMILIES]
    if args.family:
        families = [
            name
            for name in evaluation.FAMILIES
            if any(part == "all" or part.lower() in name.lower() for part in args.family)
        ]
        if not families:
            parser.error(f"no family matches {args.family}; the families: {'; '.join(evaluation.FAMILIES)}")
    data = args.data or DATA
    windows_path = args.windows or data / "windows.json"
    labels_path = args.labels or data / "labels.json"
    orion_path = args.orion or data / "orion_scores_realAWSCloudwatch.csv"
    try:
        corpus = evaluation.load(data, windows_path, labels_path, args.corpus)
    except (OSError, ValueError) as error:
        raise SystemExit(f"cannot read the series: {error}") from error
    if not corpus:
        raise SystemExit(f"no series under {data} is keyed in {windows_path}")
    readings = sum(len(series.values) for series in corpus)
    print(f"probationary period: first {evaluation.PROBATION:.0%} of each series (learning only)")
    started = time.perf_counter()
    if args.compare:
        compare(corpus, families)
    elif args.data is None:
        loso(corpus, evaluation.CANDIDATES, orion_path)
    else:
        print(f"detector: {CONFIG} (chosen on the 16 shared series; nothing is chosen here)\n")
        table(corpus, evaluation.score_matrix([CONFIG], corpus)[0], orion_path, "")
    elapsed = time.perf_counter() - started
    print(f"\n{readings:,} readings per configuration, {elapsed:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
