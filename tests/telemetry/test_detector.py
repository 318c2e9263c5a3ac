"""The streaming anomaly detector: scoring by overlapping segments, synthetic series, its state, and the online hook."""

import math

import numpy as np
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from fleet.models import Node
from telemetry.models import GPUState
from telemetry.prediction import online
from telemetry.prediction.detector import CONFIG, StreamingDetector, alarm_intervals
from telemetry.prediction.risk import NodeFeatures, node_risk
from telemetry.prediction.scoring import Scores, lead_times, overlap_segment
from telemetry.services.prediction import risk_sweep
from tests.fleet_factories import make_cluster, make_node

STEP = 300.0          # NAB's cadence: a reading every five minutes
DAY = 86400.0
T0 = 1_700_000_000.0  # a whole hour


# --- scoring ------------------------------------------------------------------------------------------------

def test_overlapping_segments_count_windows_found_missed_and_detections_astray():
    windows = [(10, 20), (40, 50), (80, 90)]
    assert overlap_segment(windows, []) == (0, 0, 3)
    assert overlap_segment([], [(1, 2)]) == (0, 1, 0)
    # one inside the first window, one touching the second's end, one astray: third window missed
    assert overlap_segment(windows, [(12, 13), (50, 55), (60, 70)]) == (2, 1, 1)
    # one detection spanning two windows finds both and is no false positive
    assert overlap_segment(windows, [(15, 45)]) == (2, 0, 1)
    # two detections in one window: one true positive, neither false
    assert overlap_segment(windows, [(11, 12), (18, 19)]) == (1, 0, 2)
    # a detection just before a window does not count
    assert overlap_segment([(10, 20)], [(0, 9.999)]) == (0, 1, 1)


def test_precision_recall_f1_and_lead_times():
    s = Scores(12, 2, 1)
    assert (round(s.precision, 3), round(s.recall, 3), round(s.f1, 3)) == (0.857, 0.923, 0.889)
    assert Scores().f1 is None and Scores(0, 0, 2).precision is None and Scores(0, 3, 0).f1 == 0.0
    total = Scores(1, 0, 1)
    total += Scores(2, 1, 0)
    assert (total.tp, total.fp, total.fn) == (3, 1, 1)
    windows, labels = [(100, 200), (300, 400)], [150, 390]
    # the first detection overlapping a window counts; before the label is early (positive)
    assert lead_times(windows, labels, [(120, 130), (140, 160), (395, 399)]) == [30, -5]
    assert lead_times(windows, labels, [(10, 20)]) == [None, None]


def test_alarm_intervals_are_runs_of_alarmed_readings():
    assert alarm_intervals([1, 2, 3, 4, 5, 6], [False, True, True, False, True, False]) == [(2, 3), (5, 5)]
    assert alarm_intervals([], []) == []


# --- the detector on synthetic series -----------------------------------------------------------------------

def run(values, *, learn_days=1.0, step=STEP):
    """Stream ``values`` (one every ``step`` s); learning only for the first ``learn_days``. Returns the
    timestamps and verdicts."""
    detector = StreamingDetector(CONFIG)
    times = [T0 + i * step for i in range(len(values))]
    verdicts = [detector.update(t, v, detect=t - T0 >= learn_days * DAY) for t, v in zip(times, values, strict=True)]
    return times, verdicts


def noise(days, seed=1, level=50.0, sigma=2.0):
    return level + sigma * np.random.default_rng(seed).standard_normal(int(days * DAY / STEP))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pure_noise_raises_nothing(seed):
    _, verdicts = run(noise(10, seed))
    assert not any(v.alarm for v in verdicts)


def test_a_daily_spike_is_learned_not_alarmed():
    values = noise(10, 4, level=0.1, sigma=0.005)
    values[int(3 * 3600 / STEP)::int(DAY / STEP)] = 1.5        # the same spike at 03:00 every day
    _, verdicts = run(values)
    assert not any(v.alarm for v in verdicts)
    values[int((8 * DAY + 15 * 3600) / STEP)] = 3.0             # ... and one twice as high on day 8
    times, verdicts = run(values)
    alarms = alarm_intervals(times, [v.alarm for v in verdicts])
    assert len(alarms) == 1 and alarms[0][0] == T0 + 8 * DAY + 15 * 3600


def test_a_spike_alarms_at_once_and_is_held():
    values = noise(6, 5)
    at = int(4 * DAY / STEP)
    values[at] = 120.0
    times, verdicts = run(values)
    assert verdicts[at].alarm and verdicts[at].new and verdicts[at].direction == 1
    assert verdicts[at].channel == "reading" and verdicts[at].deviation > 60
    assert not any(v.alarm for v in verdicts[:at])
    (start, end), = alarm_intervals(times, [v.alarm for v in verdicts])
    assert start == times[at] and end - start == pytest.approx(CONFIG.hold_seconds, abs=STEP)


def test_a_step_down_alarms_within_the_hour():
    values = noise(6, 6)
    at = int(4 * DAY / STEP)
    values[at:] -= 25.0
    times, verdicts = run(values)
    first = next(i for i, v in enumerate(verdicts) if v.alarm)
    assert at <= first <= at + 12 and verdicts[first].direction == -1
    # the new level becomes the baseline: the alarm ends within a day and a hold
    last = max(i for i, v in enumerate(verdicts) if v.alarm)
    assert times[last] - times[at] <= DAY + CONFIG.hold_seconds


def test_a_slow_drift_alarms_before_it_ends():
    values = noise(8, 7, sigma=1.0)
    start, end = int(4 * DAY / STEP), int(5 * DAY / STEP)
    values[start:end] += np.linspace(0.0, 40.0, end - start)     # warming 40 units over a day
    values[end:] += 40.0
    _, verdicts = run(values)
    first = next(i for i, v in enumerate(verdicts) if v.alarm)
    assert start < first < end                                   # seen while still drifting: ahead of the end
    assert not any(v.alarm for v in verdicts[:start])


def test_nothing_is_raised_while_learning_and_before_three_hours():
    values = noise(3, 8)
    values[10] = 500.0                                            # in the first hour: no memory yet
    values[int(0.5 * DAY / STEP)] = 500.0                         # in the learning day
    _, verdicts = run(values)
    assert not any(v.alarm for v in verdicts)


def test_readings_out_of_order_or_not_numbers_change_nothing():
    detector = StreamingDetector()
    for i in range(int(DAY / STEP)):
        detector.update(T0 + i * STEP, 50.0 + (i % 3))
    before = detector.to_bytes()
    assert detector.update(T0, 1e9).alarm is False                 # older than the last reading: ignored
    assert detector.update(T0 + DAY, math.nan).alarm is False
    assert detector.to_bytes() == before


# --- the channels the benchmark compares (off in CONFIG) ---------------------------------------------------------

def daily_cycle_with_a_flat_peak():
    """Nine days of a daily cycle; on day 8 the peak hours stay at the day's mean (inside the day's range)."""
    hours = np.arange(int(9 * DAY / STEP)) * STEP / 3600.0
    values = 50 + 20 * np.sin(2 * np.pi * hours / 24) + np.random.default_rng(4).normal(0, 0.5, len(hours))
    odd = (hours >= 8 * 24 + 4) & (hours < 8 * 24 + 10)
    values[odd] = 50.0
    return [T0 + i * STEP for i in range(len(values))], values


@pytest.mark.parametrize("seasonal", ["profile", "stl"])
def test_the_seasonal_channel_learns_a_daily_cycle_and_catches_a_day_that_breaks_it(seasonal):
    from dataclasses import replace

    config = replace(CONFIG, seasonal=seasonal)
    times, values = daily_cycle_with_a_flat_peak()
    detector = StreamingDetector(config)
    verdicts = [detector.update(t, v, detect=t - T0 >= 2 * DAY) for t, v in zip(times, values, strict=True)]
    assert not any(v.alarm for t, v in zip(times, verdicts, strict=True) if t < T0 + 8 * DAY)
    assert {v.channel for v in verdicts if v.new} == {"seasonal"}
    assert not any(v.alarm for v in run(values)[1])                 # the core alone does not see it
    assert StreamingDetector.from_bytes(detector.to_bytes(), config).to_bytes() == detector.to_bytes()


def test_the_discord_channel_scores_a_shape_the_memory_never_had():
    from dataclasses import replace

    config = replace(CONFIG, discord_blocks=6)
    times, values = daily_cycle_with_a_flat_peak()
    detector, discords = StreamingDetector(config), []
    for t, v in zip(times, values, strict=True):
        detector.update(t, v)
        discords.append((t, detector.D))
    usual = max(d for t, d in discords if T0 + 3 * DAY <= t < T0 + 8 * DAY)
    odd = max(d for t, d in discords if t >= T0 + 8 * DAY)
    assert odd > 10 * usual and usual < 0.1


# --- state ----------------------------------------------------------------------------------------------------

def test_state_round_trip_continues_exactly():
    values = noise(6, 9)
    values[int(4.5 * DAY / STEP)] = 150.0
    times = [T0 + i * STEP for i in range(len(values))]
    whole = StreamingDetector()
    expected = [whole.update(t, v, detect=t - T0 >= DAY) for t, v in zip(times, values, strict=True)]
    assert any(v.alarm for v in expected)
    got, detector = [], StreamingDetector()
    for t, v in zip(times, values, strict=True):
        detector = StreamingDetector.from_bytes(detector.to_bytes())   # as if every reading came to a new process
        got.append(detector.update(t, v, detect=t - T0 >= DAY))
    assert [(v.alarm, v.new, round(v.score, 9)) for v in got] == [(v.alarm, v.new, round(v.score, 9)) for v in expected]
    assert StreamingDetector.from_bytes(StreamingDetector(phase=1800).to_bytes()).phase == 1800
    blob = detector.to_bytes()
    assert len(blob) < 8000                                          # bounded: a week of hours, not the readings
    with pytest.raises(ValueError):
        StreamingDetector.from_bytes(b"nonsense")
    with pytest.raises(ValueError):
        StreamingDetector.from_bytes(blob[:-8])


# --- online --------------------------------------------------------------------------------------------------

@pytest.fixture
def detectors():
    connection = redis.Redis.from_url(settings.REDIS_URL)
    touched = []
    yield connection, touched
    online.forget(touched, connection=connection)


def test_online_a_node_going_anomalous_outranks_a_steady_one(detectors):
    connection, touched = detectors
    touched += [901, 902]
    rng = np.random.default_rng(10)
    start = timezone.now().timestamp() - 2 * DAY
    for i in range(int(1.5 * DAY / STEP)):                           # a day and a half of steady beats
        features = {n: NodeFeatures(node_id=n, temperature_max=60 + rng.normal(0, 0.5)) for n in (901, 902)}
        online.observe(features, start + i * STEP, connection=connection)
        assert all(f.anomaly == 0.0 for f in features.values())
    features = {901: NodeFeatures(node_id=901, temperature_max=60.2), 902: NodeFeatures(node_id=902, temperature_max=76)}
    raised = online.observe(features, start + 1.5 * DAY, connection=connection)
    steady, hot = node_risk(features[901]), node_risk(features[902])
    assert raised == 1 and features[902].anomaly == 1.0 and features[901].anomaly == 0.0
    assert steady.score == 0.0 and hot.score == pytest.approx(0.6) and hot.kind == "anomaly"
    assert "hottest GPU temperature unusual for this node: 76" in hot.cause and "usual 60" in hot.cause


@pytest.mark.django_db
def test_risk_sweep_takes_the_anomaly_term_from_state_kept_between_beats(detectors):
    connection, touched = detectors
    cluster = make_cluster()
    steady, odd = make_node(cluster, "steady"), make_node(cluster, "odd")
    touched += [steady.pk, odd.pk]
    now = timezone.now()
    for node in (steady, odd):
        for gpu in node.gpus.all():
            GPUState.objects.create(gpu=gpu, node=node, ts=now, temperature=55.0, temperature_ewma=55.0)
    start = now - timezone.timedelta(days=2)
    beat = timezone.timedelta(minutes=10)
    for i in range(int(1.5 * DAY / 600)):                             # a day and a half of sweeps
        GPUState.objects.update(temperature=55.0 + (i % 5) * 0.2)
        risk_sweep(now=start + i * beat)
    assert connection.hexists(online.HASH, f"{odd.pk}:gpu_temperature")
    GPUState.objects.filter(node=odd).update(temperature=72.0)       # well under any thermal limit, but not its usual
    result = risk_sweep(now=start + int(1.5 * DAY / 600) * beat)
    steady.refresh_from_db()
    odd.refresh_from_db()
    assert steady.risk_score == 0.0 and odd.risk_score == pytest.approx(0.6)
    assert result.top[0][0] == odd.pk and "unusual for this node" in result.top[0][2]
    assert not result.predictions                                    # alone it stays under the 0.8 threshold
    assert Node.objects.filter(pk=odd.pk, risk_score__gt=0.5).exists()
