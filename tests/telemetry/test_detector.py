"""The streaming anomaly detector: scoring by overlapping segments, synthetic series, its state, and the online hook."""

import math
from dataclasses import replace

import numpy as np
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from fleet.models import Node
from telemetry.models import GPUState
from telemetry.prediction import online
from telemetry.prediction.detector import CONFIG, StreamingDetector, Verdict, _change_point, alarm_intervals
from telemetry.prediction.risk import NodeFeatures, node_risk
from telemetry.prediction.scoring import Scores, lead_times, overlap_segment
from telemetry.services.prediction import risk_sweep
from tests.support.factories import make_cluster, make_node

STEP = 300.0  # NAB's cadence: a reading every five minutes
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


def run(values, *, learn_days=1.0, step=STEP, config=CONFIG):
    """Stream ``values`` (one every ``step`` s) through a detector of ``config``; learning only for the first
    ``learn_days``. Returns the timestamps and verdicts."""
    detector = StreamingDetector(config)
    times = [T0 + i * step for i in range(len(values))]
    verdicts = [
        detector.update(t, v, detect=t - T0 >= learn_days * DAY) for t, v in zip(times, values, strict=True)
    ]
    return times, verdicts


def noise(days, seed=1, level=50.0, sigma=2.0):
    return level + sigma * np.random.default_rng(seed).standard_normal(int(days * DAY / STEP))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pure_noise_raises_nothing(seed):
    _, verdicts = run(noise(10, seed))
    assert not any(v.alarm for v in verdicts)


def test_a_daily_spike_is_learned_not_alarmed():
    values = noise(10, 4, level=0.1, sigma=0.005)
    values[int(3 * 3600 / STEP) :: int(DAY / STEP)] = 1.5  # the same spike at 03:00 every day
    _, verdicts = run(values)
    assert not any(v.alarm for v in verdicts)
    values[int((8 * DAY + 15 * 3600) / STEP)] = 3.0  # ... and one twice as high on day 8
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
    ((start, end),) = alarm_intervals(times, [v.alarm for v in verdicts])
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
    values[start:end] += np.linspace(0.0, 40.0, end - start)  # warming 40 units over a day
    values[end:] += 40.0
    _, verdicts = run(values)
    first = next(i for i, v in enumerate(verdicts) if v.alarm)
    assert start < first < end  # seen while still drifting: ahead of the end
    assert not any(v.alarm for v in verdicts[:start])


def test_nothing_is_raised_while_learning_and_before_three_hours():
    values = noise(3, 8)
    values[10] = 500.0  # in the first hour: no memory yet
    values[int(0.5 * DAY / STEP)] = 500.0  # in the learning day
    _, verdicts = run(values)
    assert not any(v.alarm for v in verdicts)


def test_readings_out_of_order_or_not_numbers_change_nothing():
    detector = StreamingDetector()
    for i in range(int(DAY / STEP)):
        detector.update(T0 + i * STEP, 50.0 + (i % 3))
    before = detector.to_bytes()
    assert detector.update(T0, 1e9).alarm is False  # older than the last reading: ignored
    assert detector.update(T0 + DAY, math.nan).alarm is False
    assert detector.to_bytes() == before


# --- the channels the benchmark compares (all but the slow level are off in CONFIG) -----------------------------


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
    assert not any(v.alarm for v in run(values)[1])  # the core alone does not see it
    assert StreamingDetector.from_bytes(detector.to_bytes(), config).to_bytes() == detector.to_bytes()


def test_the_weekly_profile_catches_a_day_below_its_weekday_though_within_the_weeks_range():
    """Three weeks of a weekly cycle (busy mid-week, quiet at the weekend) with a daily one on top; on the fourth
    week's first day the level stays 15 below it (a holiday): within the range of the weeks and under the last
    day's baseline by less than its spread, so ordinary for CONFIG, but not for that hour of the week."""
    hours = np.arange(int(22 * DAY / STEP)) * STEP / 3600.0
    values = 45 + 15 * np.cos(2 * np.pi * hours / 168) + 10 * np.sin(2 * np.pi * hours / 24)
    values += np.random.default_rng(7).normal(0, 0.5, len(hours))
    values[(hours >= 21 * 24) & (hours < 22 * 24)] -= 15.0
    times = [T0 + i * STEP for i in range(len(values))]
    config = replace(CONFIG, seasonal="weekly")
    detector = StreamingDetector(config)
    verdicts = [detector.update(t, v, detect=t - T0 >= 8 * DAY) for t, v in zip(times, values, strict=True)]
    raised = [(t, v.channel) for t, v in zip(times, verdicts, strict=True) if v.new]
    assert raised and all(t >= T0 + 21 * DAY for t, _ in raised), raised
    assert raised[0][1] == "seasonal" and raised[0][0] < T0 + 21 * DAY + 3 * 3600  # within its first hours
    assert not any(v.new for v in run(values, learn_days=8.0)[1])  # CONFIG alone does not see it
    assert StreamingDetector.from_bytes(detector.to_bytes(), config).to_bytes() == detector.to_bytes()


def test_an_hourly_series_learns_from_readings_on_the_hour():
    """A reading every hour, on the hour, is its hour's only reading: each hour must still be remembered (the
    reading at an hour's first second once fell outside it, and such a series never learnt anything)."""
    values = 50.0 + np.random.default_rng(8).normal(0, 1.0, 24 * 8)
    values[24 * 6] = 90.0
    on_the_hour = math.floor(T0 / 3600) * 3600  # T0 itself is 800 s past an hour
    detector, raised = StreamingDetector(), []
    for i, value in enumerate(values):
        if detector.update(on_the_hour + i * 3600, value, detect=i >= 24).new:
            raised.append(i)
        if i == 29:
            assert detector.blocks == 29 and math.isfinite(detector.B) and abs(detector.B - 50.0) < 1.0
    assert raised == [24 * 6]


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


def first_alarm(verdicts, since):
    """Hours from reading ``since`` to the first alarm raised, and the channel that raised it (None: none)."""
    found = next(((i, v.channel) for i, v in enumerate(verdicts) if v.new), None)
    return found and ((found[0] - since) * STEP / 3600.0, found[1])


def test_the_slow_channel_sees_a_drift_that_the_daily_baseline_follows():
    values = noise(12, 3, sigma=1.0)
    start = int(4 * DAY / STEP)
    values[start:] += (
        np.arange(len(values) - start) * STEP / 3600.0 * 0.1
    )  # 0.1 units an hour, for eight days
    assert CONFIG.slow
    hours, channel = first_alarm(run(values)[1], start)
    assert channel == "slow" and 12 < hours < 96  # once the level is out of the two weeks' range
    # without it, the baseline (the last day) keeps up with the drift and nothing is ever raised
    assert first_alarm(run(values, config=replace(CONFIG, slow=False))[1], start) is None


def test_the_drift_channel_adds_up_a_shift_too_small_for_the_level_channel():
    values = noise(10, 4, sigma=1.0)
    start = int(5 * DAY / STEP)
    values[start : start + int(DAY / STEP)] += 1.5  # about 2 spreads, for a day: under z_min (2.5)
    core = replace(CONFIG, slow=False)
    assert first_alarm(run(values, config=core)[1], start) is None
    hours, channel = first_alarm(run(values, config=replace(core, drift_k=1.0, drift_h=4.0))[1], start)
    assert channel == "drift" and 2 < hours < 12  # 4 spread-hours, about half a spread an hour beyond


def test_the_trend_channel_warns_before_the_level_gets_there():
    values = noise(8, 5, sigma=1.0)
    start, length = int(5 * DAY / STEP), int(DAY / 2 / STEP)
    values[start : start + length] += np.linspace(0.0, 30.0, length)  # 30 units over twelve hours
    values[start + length :] += 30.0
    core = replace(CONFIG, slow=False)
    level_hours, level_channel = first_alarm(run(values, config=core)[1], start)
    trend_hours, trend_channel = first_alarm(run(values, config=replace(core, trend_blocks=6))[1], start)
    assert (level_channel, trend_channel) == ("level", "trend") and trend_hours < level_hours


def test_the_change_point_is_ruptures_best_split_of_the_last_two_days():
    rng = np.random.default_rng(1)
    recent = np.r_[np.zeros(44), np.full(4, 5.0)] + rng.normal(0, 0.1, 48)
    assert _change_point(recent, 1.0) == pytest.approx(5.0, abs=0.2)  # the shift's size, in spreads
    assert _change_point(recent, 2.0) == pytest.approx(2.5, abs=0.1)
    assert _change_point(np.r_[np.zeros(24), np.full(24, 5.0)], 1.0) == 0.0  # a day ago: not a new change
    assert _change_point(np.zeros(10), 1.0) == 0.0  # too short to tell


@pytest.mark.parametrize("library", ["page_hinkley", "adwin", "half_space_trees"])
def test_rivers_models_run_as_a_channel_and_cannot_be_carried_between_processes(library):
    config = replace(CONFIG, slow=False, library=library)
    values = noise(6, 6, sigma=1.0)
    values[int(4 * DAY / STEP) :] -= 6.0
    detector = StreamingDetector(config)
    verdicts = [detector.update(T0 + i * STEP, v, detect=i * STEP >= DAY) for i, v in enumerate(values)]
    assert any(v.new for v in verdicts) and detector.model is not None
    with pytest.raises(ValueError, match="river"):
        detector.to_bytes()


def test_a_slow_level_alarm_is_described_against_the_two_weeks():
    verdict = Verdict(alarm=True, score=1.0, channel="slow", direction=1, deviation=9.0, baseline=61.0)
    assert online.describe("gpu_temperature", verdict, 70.0) == (
        "hottest GPU temperature unusual for this node: 70 °C its last hour, above its two weeks' usual 61 °C"
    )
    verdict.channel = "reading"
    assert online.describe("gpu_temperature", verdict, 70.0).endswith("70 °C now, above its usual 61 °C")


# --- state ----------------------------------------------------------------------------------------------------

# the shipped configuration, and one with every channel that keeps state of its own switched on
EVERY_CHANNEL = replace(CONFIG, drift_k=2.0, trend_blocks=6, library="ruptures")


@pytest.mark.parametrize("config", [CONFIG, EVERY_CHANNEL], ids=["shipped", "every channel"])
def test_state_round_trip_continues_exactly(config):
    values = noise(6, 9)
    values[int(4.5 * DAY / STEP)] = 150.0
    values[int(5 * DAY / STEP) :] += np.linspace(0, 20, len(values) - int(5 * DAY / STEP))  # and a drift
    times = [T0 + i * STEP for i in range(len(values))]
    whole = StreamingDetector(config)
    expected = [whole.update(t, v, detect=t - T0 >= DAY) for t, v in zip(times, values, strict=True)]
    assert any(v.alarm for v in expected)
    got, detector = [], StreamingDetector(config)
    for t, v in zip(times, values, strict=True):
        detector = StreamingDetector.from_bytes(
            detector.to_bytes(), config
        )  # as if each reading came to a new process
        got.append(detector.update(t, v, detect=t - T0 >= DAY))
    assert [(v.alarm, v.new, round(v.score, 9)) for v in got] == [
        (v.alarm, v.new, round(v.score, 9)) for v in expected
    ]
    assert (detector.G_up, detector.T, detector.M, detector.L) == (whole.G_up, whole.T, whole.M, whole.L)
    assert StreamingDetector.from_bytes(StreamingDetector(phase=1800).to_bytes()).phase == 1800
    blob = detector.to_bytes()
    assert len(blob) < 9000  # bounded: two weeks of hours, not the readings
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
    for i in range(int(1.5 * DAY / STEP)):  # a day and a half of steady beats
        features = {n: NodeFeatures(node_id=n, temperature_max=60 + rng.normal(0, 0.5)) for n in (901, 902)}
        online.observe(features, start + i * STEP, connection=connection)
        assert all(f.anomaly == 0.0 for f in features.values())
    features = {
        901: NodeFeatures(node_id=901, temperature_max=60.2),
        902: NodeFeatures(node_id=902, temperature_max=76),
    }
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
    for i in range(int(1.5 * DAY / 600)):  # a day and a half of sweeps
        GPUState.objects.update(temperature=55.0 + (i % 5) * 0.2)
        risk_sweep(now=start + i * beat)
    assert connection.hexists(online.HASH, f"{odd.pk}:gpu_temperature")
    GPUState.objects.filter(node=odd).update(
        temperature=72.0
    )  # well under any thermal limit, but not its usual
    result = risk_sweep(now=start + int(1.5 * DAY / 600) * beat)
    steady.refresh_from_db()
    odd.refresh_from_db()
    assert steady.risk_score == 0.0 and odd.risk_score == pytest.approx(0.6)
    assert result.top[0][0] == odd.pk and "unusual for this node" in result.top[0][2]
    assert not result.predictions  # alone it stays under the 0.8 threshold
    assert Node.objects.filter(pk=odd.pk, risk_score__gt=0.5).exists()
