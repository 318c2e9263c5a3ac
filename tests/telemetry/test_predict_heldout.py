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

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "anomaly"
TADGAN_AWS = Scores(12, 2, 1)          # Orion's published TadGAN sums on the nine realAWSCloudwatch series


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
    assert aws.f1 > TADGAN_AWS.f1 and aws.f1 >= 0.96, aws
    assert known.f1 >= 0.53, known
    assert overall.f1 >= 0.72, overall
    assert statistics.median(leads) >= 0.0 and sum(lead > 0 for lead in leads) >= 7
    assert seconds < 60


def test_the_shipped_configuration_is_the_one_chosen_on_all_sixteen(evaluated):
    corpus, matrix, folds, _ = evaluated
    assert evaluation.CANDIDATES[evaluation.choose(matrix, list(range(len(corpus))))] == CONFIG
    # each fold chose without its held-out series: the choice on fifteen never looked at the sixteenth
    for fold in folds:
        others = [s for s in range(len(corpus)) if s != fold.series]
        assert fold.chosen == evaluation.choose(matrix, others)
