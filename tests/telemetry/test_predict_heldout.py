"""The detector on series it has not seen: leave-one-series-out over the sixteen shared labelled series (NAB's
realAWSCloudwatch and realKnownCause), as ``bench/predictor_nab.py`` runs it. The floors are the scores it
reaches (docs/prediction.md): a change that makes it worse on unseen series fails here."""

import statistics
import time
from pathlib import Path

import pytest

from telemetry.prediction import evaluation
from telemetry.prediction.detector import CONFIG
from telemetry.prediction.scoring import Scores

DATA = Path(__file__).resolve().parents[2] / "data" / "anomaly"
pytestmark = pytest.mark.slow  # the score matrix is computed in a pool of processes

TADGAN_AWS = Scores(12, 2, 1)  # Orion's published TadGAN sums on the nine realAWSCloudwatch series


@pytest.fixture(scope="module")
def evaluated():
    corpus = evaluation.load(DATA, DATA / "windows.json", DATA / "labels.json")
    started = time.perf_counter()
    matrix = evaluation.score_matrix(evaluation.CANDIDATES, corpus)
    return corpus, matrix, evaluation.leave_one_out(matrix), time.perf_counter() - started


def held_out(corpus, folds, folder=None) -> tuple[Scores, list[float]]:
    total, leads = Scores(), []
    for fold in folds:
        if folder is None or corpus[fold.series].folder == folder:
            total += fold.result.scores
            leads += fold.result.found_leads
    return total, leads


def test_the_shared_series_are_all_there(evaluated):
    corpus, *_ = evaluated
    assert {s.folder for s in corpus} == {"realAWSCloudwatch", "realKnownCause"} and len(corpus) == 16
    assert sum(len(s.windows) for s in corpus) == 32


def test_held_out_f1_beats_tadgan_on_aws_and_holds_its_floors(evaluated):
    corpus, _, folds, seconds = evaluated
    aws, _ = held_out(corpus, folds, "realAWSCloudwatch")
    known, _ = held_out(corpus, folds, "realKnownCause")
    overall, leads = held_out(corpus, folds)
    # 12/0/1, 10/9/9, 22/9/10 (docs/prediction.md); lower than before the fix to hourly series (which left
    # ambient_temperature_system_failure unwatched, and so without its false alarms), not a worse detector
    assert aws.f1 > TADGAN_AWS.f1 and aws.f1 >= 0.96, aws
    assert known.f1 > 0.5 and known.f1 >= 0.526, known
    assert overall.f1 >= 0.698, overall
    # the median lead is +0.0 h, not above it (docs/prediction.md, *Lead time*): a floor at what is reached
    assert statistics.median(leads) >= 0.0 and sum(lead > 0 for lead in leads) >= 9
    early_inside = sum(fold.result.early[1] for fold in folds)
    assert early_inside >= 7  # detections raised inside their window ahead of the label, not held from before
    assert (
        seconds < 180
    )  # eight candidates over 103,758 readings: 46-82 s on two cores at load average 6-7, 110 s at 10


def test_the_shipped_configuration_is_the_one_chosen_on_all_sixteen(evaluated):
    corpus, matrix, folds, _ = evaluated
    assert evaluation.CANDIDATES[evaluation.choose(matrix, list(range(len(corpus))))] == CONFIG
    # each fold chose without its held-out series: the choice on fifteen never looked at the sixteenth
    for fold in folds:
        others = [s for s in range(len(corpus)) if s != fold.series]
        assert fold.chosen == evaluation.choose(matrix, others)


def _result(tp, fp, fn, leads):
    return evaluation.Result(Scores(tp, fp, fn), leads, [False] * len(leads))


def test_the_choice_prefers_the_earlier_warning_among_candidates_of_similar_f1():
    hour = 3600.0
    best = [_result(10, 1, 1, [0.0] * 10)]  # F1 0.909, warns at the label
    close = [_result(10, 1, 1, [2 * hour] * 6 + [0.0] * 4)]  # the same F1, two hours earlier
    slightly_worse = [_result(10, 1, 2, [5 * hour] * 10)]  # F1 0.870: beyond the margin
    assert evaluation.choose([best, close], [0]) == 1
    assert evaluation.choose([best, slightly_worse], [0]) == 0
    assert evaluation.F1_MARGIN < best[0].scores.f1 - slightly_worse[0].scores.f1
    within = [_result(17, 2, 2, [hour] * 17)]  # F1 0.895: within 0.02 of 0.909, an hour early
    assert evaluation.choose([best, within], [0]) == 1
    # at the same lead, the better F1; at the same F1 and lead, the simpler (the first)
    assert evaluation.choose([[_result(9, 1, 2, [0.0] * 9)], best], [0]) == 1
    assert evaluation.choose([best, [_result(10, 1, 1, [0.0] * 10)]], [0]) == 0
