"""A streaming anomaly detector for one series: ``update(ts, value)`` per reading, small bounded state.

The same core scores NAB's series offline (``bench/predictor_nab.py``) and each node's series online (the
risk sweep's anomaly term, ``telemetry/prediction/online.py``), with ONE configuration for every series
(``CONFIG``: the candidate of ``telemetry.prediction.evaluation`` chosen by leave-one-series-out on the sixteen
shared labelled series; docs/prediction.md). The method:

* **Memory in hourly blocks.** Each completed hour is summarised (median, max, min, mean absolute deviation
  from its median) into a ring of the last ``memory_blocks`` hours (two weeks). Nothing else about the past is
  kept, so the state is bounded whatever the cadence (plus the last hour's readings, at most 64, for the level).
* **Baseline and spread.** The baseline ``B`` is the median of the last day's hourly medians; the spread ``S``
  is the larger of the typical within-hour deviation and the median deviation of the hourly medians from ``B``.
  Both change only when an hour closes, so an anomaly does not drag its own baseline along while it happens.
* **Channels, both directions.** The reading itself (spikes) and the median of the last hour (sustained
  shifts) are compared with ``B``, upwards and downwards; the same median also against the whole memory's median
  (``slow``: a drift slow enough for the last day's baseline to follow it). More channels can be switched on (the
  families the benchmark compares; the shipped configuration has them off, they held out worse): the level
  against the hour's seasonal expectation (``seasonal``: a daily or weekly profile, or statsmodels' STL), the discord of
  the last hours' shape against every earlier stretch of the memory (``discord_blocks``: stumpy's MASS), the level
  carried ahead at its slope (``trend_blocks``), a CUSUM of small deviations (``drift_k``), and a library's
  detector (``library``: ruptures' change points on the last two days, or river's half-space trees, Page-Hinkley
  or ADWIN; river's state is not carried by ``to_bytes``).
* **An excursion** begins when a channel's deviation passes ``z_min · S`` and ends when it falls back. It raises
  an alarm when it goes further than ``(1 + margin)`` times the largest deviation the channel showed in the
  memory — as it stood when the excursion began, so a slow drift cannot ratchet its own reference — *and* the
  value is rare in the memory (reached in fewer than ``alpha`` of its hours; a memory shorter than ``1 / alpha``
  hours cannot establish rarity and does not veto).
* **Hold.** An alarm stays raised ``hold_seconds`` (the 24 h prediction horizon) after its excursion ends.
"""

import math
import statistics
import struct
from dataclasses import dataclass

import numpy as np

# (channel, direction): the reading up/down, the last hour's median up/down, the last hour's median against the
# daily profile up/down, and how far the last hours' shape is from every earlier one (a discord: up only)
KEYS = (
    ("reading", 1),
    ("reading", -1),
    ("level", 1),
    ("level", -1),
    ("seasonal", 1),
    ("seasonal", -1),
    ("discord", 1),
    ("drift", 1),
    ("drift", -1),
    ("trend", 1),
    ("trend", -1),
    ("slow", 1),
    ("slow", -1),
    ("library", 1),
)
K = len(KEYS)
DRIFT_UP, DRIFT_DOWN = KEYS.index(("drift", 1)), KEYS.index(("drift", -1))
TREND_UP, TREND_DOWN = KEYS.index(("trend", 1)), KEYS.index(("trend", -1))
SLOW_UP, SLOW_DOWN = KEYS.index(("slow", 1)), KEYS.index(("slow", -1))
LIBRARY = KEYS.index(("library", 1))
# the library channels (bench/predictor_nab.py --compare): river's models keep their own state, which the fixed
# layout of ``to_bytes`` does not carry, so a detector with one of them runs in one process only
RIVER = ("half_space_trees", "page_hinkley", "adwin")


@dataclass(frozen=True)
class DetectorConfig:
    block_seconds: float = 3600.0  # resolution of the memory: one summary per hour
    baseline_blocks: int = 24  # the baseline is the last day (covers a daily cycle)
    memory_blocks: int = 336  # records and rarity look back two weeks (a weekly cycle, twice)
    level_seconds: float = 3600.0  # the level channel: median of the last hour
    level_readings: int = 64  # at most this many of the last hour's readings are kept
    z_min: float = 2.5  # an excursion starts beyond 2.5 spreads from the baseline
    margin: float = 0.5  # ... and alarms when 1.5x the memory's largest excursion
    alpha: float = 0.05  # ... at a value reached in fewer than 5 % of the memory's hours
    hold_seconds: float = (
        24 * 3600.0
    )  # an alarm is held 24 h (the prediction horizon) after its excursion ends
    min_blocks: int = 3  # no verdict before three hours of memory
    seasonal: str = ""  # the seasonal channel (off: ""): the level against the hour's expectation,
    # "profile" (median of the same hour on the days kept), "weekly" (the same
    # hour of the week, a week and two back) or "stl" (statsmodels)
    discord_blocks: int = 0  # the discord channel (0: off): the last N hours' shape against the week's
    drift_k: float = 0.0  # the drift channel (0: off): a CUSUM of the readings' deviation beyond
    # drift_k spreads (each clipped at z_min), in spread-hours
    drift_h: float = 6.0  # ... an excursion starts at drift_h spread-hours of accumulated deviation
    trend_blocks: int = 0  # the trend channel (0: off): the last hour's level carried forward
    trend_ahead: float = 6.0  # ... trend_ahead hours at the slope of the last trend_blocks hourly medians
    slow: bool = True  # the slow channel: the last hour's level against the whole memory's median
    # (not the last day's, which follows a slow drift), in the memory's spread
    library: str = ""  # a library's detector as one more channel (off: ""): river's
    # "half_space_trees", "page_hinkley" or "adwin" on the readings, or
    # "ruptures" (a change point in the last two days' hourly medians)


CONFIG = DetectorConfig()


@dataclass
class Verdict:
    alarm: bool  # an alarm is raised (or held) at this reading
    score: float  # in [0, 1]: 1 while alarmed, else how close the strongest excursion came
    channel: str = ""  # "reading", "level", "seasonal" or "discord": what drove the score
    direction: int = 0  # +1 above the baseline, -1 below
    deviation: float = 0.0  # value minus baseline, in the series' units
    baseline: float = math.nan
    new: bool = False  # an alarm started at this reading


_SCALARS = (
    "phase",
    "t0",
    "last_ts",
    "block_start",
    "cur_hi",
    "cur_lo",
    "until",
    "B",
    "S",
    "E",
    "SE",
    "D",
    "G_up",
    "G_down",
    "T",
    "M",
    "SM",
    "L",
    "blocks",
    "ring_head",
    "ring_n",
    "days_head",
    "days_n",
    "recent_head",
    "recent_n",
)
_PER_KEY = ("today", "ref", "ref_week", "rare_above", "excursion", "on")
_MAGIC = b"LSD3"


class StreamingDetector:
    """One series' detector. ``update`` folds a reading in and returns a ``Verdict``; ``to_bytes`` and
    ``from_bytes`` carry the state (a few kilobytes) between processes."""

    def __init__(self, config: DetectorConfig = CONFIG, *, phase: float = 0.0):
        """``phase`` shifts where the hourly blocks begin (seconds past the hour): it changes nothing in what is
        detected, only when each hour's bookkeeping is done, so that many detectors need not do it at once."""
        c = self.config = config
        self.phase = float(phase) % c.block_seconds
        self.t0 = self.last_ts = self.block_start = math.nan
        self.cur_hi, self.cur_lo = -math.inf, math.inf
        self.until = -math.inf
        self.B, self.S = math.nan, math.nan
        self.E, self.SE = math.nan, math.nan  # the seasonal expectation for this hour and its spread
        self.D = 0.0  # the discord of the last hours' shape
        self.G_up = self.G_down = 0.0  # the drift channel's CUSUMs (spread-hours)
        self.T = 0.0  # the trend channel's slope (units per hour)
        self.M, self.SM = math.nan, math.nan  # the slow channel's reference: the memory's median, spread
        self.L = 0.0  # the library channel's value
        self.model = _river_model(c.library) if c.library in RIVER else None
        self.blocks = 0  # hours closed so far
        self.ring = np.zeros((c.memory_blocks, 4), np.float32)  # median, max, min, mean abs deviation
        self.ring_head = self.ring_n = 0
        days = c.memory_blocks // c.baseline_blocks
        self.days = np.zeros((days, K), np.float32)  # each past day's largest deviation per key
        self.days_head = self.days_n = 0
        self.recent_t = np.zeros(c.level_readings, np.float64)
        self.recent_v = np.zeros(c.level_readings, np.float64)
        self.recent_head = self.recent_n = 0
        self.today = [0.0] * K  # today's largest deviation per key
        self.excursion = [False] * K
        self.on = [False] * K
        self.ref = [0.0] * K  # the week's record when the excursion began
        self.ref_week = [0.0] * K  # the week's record as of the last closed day
        self.rare_above = [-math.inf] * K  # a value beyond this is rare in the week's memory

    # --- readings ---------------------------------------------------------------------------------------

    def update(self, ts: float, value: float, *, detect: bool = True) -> Verdict:
        """Fold in one reading (``ts`` in seconds). ``detect=False`` learns without raising alarms (a warm-up,
        e.g. NAB's probationary period). A reading older than the last one is ignored."""
        c = self.config
        value = float(value)
        if not math.isfinite(value):
            return Verdict(alarm=ts <= self.until, score=1.0 if ts <= self.until else 0.0)
        if math.isnan(self.t0):
            self.t0 = ts
            self.block_start = self._block_of(ts)
        elif ts < self.last_ts:  # an older reading (a replay, a clock step) is history: it changes nothing
            held = ts <= self.until or any(self.on)
            return Verdict(alarm=held, score=1.0 if held else 0.0, baseline=self.B)
        if ts >= self.block_start + c.block_seconds:
            self._close_block()
            self.block_start = self._block_of(ts)
        # the time this reading stands for (the drift channel's weight): since the last one, at most an hour
        dt = min(ts - self.last_ts, c.level_seconds) if math.isfinite(self.last_ts) else 0.0
        self.last_ts = ts
        self._remember(ts, value)
        verdict = Verdict(alarm=False, score=0.0)
        if self.blocks >= c.min_blocks:
            if c.drift_k:
                self._drift(value, dt)
            if self.model is not None:
                self._river(value)
            verdict = self._judge(ts, value, detect)
        if value > self.cur_hi:
            self.cur_hi = value
        if value < self.cur_lo:
            self.cur_lo = value
        if any(self.on):
            self.until = ts + c.hold_seconds
            verdict.alarm, verdict.score = True, 1.0
        elif ts <= self.until:
            verdict.alarm, verdict.score = True, 1.0
        return verdict

    def _drift(self, value: float, dt: float) -> None:
        """Page's CUSUM, both ways, of the reading's deviation from the baseline in spreads (clipped at ``z_min``, so
        that a spike adds little and only a sustained deviation accumulates), beyond ``drift_k`` spreads, weighted by
        the hours each reading stands for: a slow drift adds up to spread-hours before any reading is extreme."""
        c = self.config
        z = max(-c.z_min, min(c.z_min, (value - self.B) / self.S))
        hours = dt / 3600.0
        self.G_up = max(0.0, self.G_up + (z - c.drift_k) * hours)
        self.G_down = max(0.0, self.G_down + (-z - c.drift_k) * hours)

    def _river(self, value: float) -> None:
        """river's model on the reading's deviation from the baseline in spreads: half-space trees score it (with the
        last hour's, squashed into [0, 1]) before learning it; a drift detector updates and says whether it drifted."""
        z = (value - self.B) / self.S
        if self.config.library == "half_space_trees":
            level = self._recent(self.last_ts - self.config.level_seconds)
            features = {
                "z": 0.5 + 0.5 * math.tanh(z / 10),
                "level": 0.5 + 0.5 * math.tanh((statistics.median(level) - self.B) / self.S / 10)
                if level
                else 0.5,
            }
            self.L = -math.log(max(1e-9, 1.0 - self.model.score_one(features)))
            self.model.learn_one(features)
        else:
            self.model.update(max(-10.0, min(10.0, z)))
            self.L = 1.0 if self.model.drift_detected else 0.0

    def _block_of(self, ts: float) -> float:
        c = self.config
        return math.floor((ts - self.phase) / c.block_seconds) * c.block_seconds + self.phase

    def _remember(self, ts: float, value: float) -> None:
        i = self.recent_head
        self.recent_t[i], self.recent_v[i] = ts, value
        self.recent_head = (i + 1) % self.config.level_readings
        self.recent_n = min(self.recent_n + 1, self.config.level_readings)

    def _recent(self, since: float, *, inclusive: bool = False) -> list[float]:
        """The kept readings newer than ``since`` (or at it, ``inclusive``), as plain floats: for a few dozen
        values, faster than numpy."""
        n = self.recent_n
        times, values = self.recent_t[:n].tolist(), self.recent_v[:n].tolist()
        if inclusive:
            return [v for t, v in zip(times, values, strict=True) if t >= since]
        return [v for t, v in zip(times, values, strict=True) if t > since]

    def _channels(self, value: float, level: float) -> list[tuple[int, float, float, float]]:
        """The channels switched on, per key: (key, value, what it is compared with, the deviation an excursion
        starts at); a NaN reference means the channel has no verdict yet."""
        c = self.config
        start = c.z_min * self.S
        out = [
            (0, value, self.B, start),
            (1, value, self.B, start),
            (2, level, self.B, start),
            (3, level, self.B, start),
        ]
        if c.seasonal:
            out += [(4, level, self.E, c.z_min * self.SE), (5, level, self.E, c.z_min * self.SE)]
        if (
            c.discord_blocks
        ):  # an RMS difference (in spreads) from the nearest earlier shape: z_min of them to start
            out.append((6, self.D, 0.0, c.z_min))
        if c.drift_k:
            out += [(DRIFT_UP, self.G_up, 0.0, c.drift_h), (DRIFT_DOWN, -self.G_down, 0.0, c.drift_h)]
        if c.trend_blocks:
            ahead = level + self.T * c.trend_ahead
            out += [(TREND_UP, ahead, self.B, start), (TREND_DOWN, ahead, self.B, start)]
        if c.slow:
            out += [
                (SLOW_UP, level, self.M, c.z_min * self.SM),
                (SLOW_DOWN, level, self.M, c.z_min * self.SM),
            ]
        if c.library:
            # half-space trees: -log(1 - score), from a score of 0.9; a drift detector: 1 when it says so; a change
            # point: the shift's size in spreads, from z_min
            floor = {"half_space_trees": math.log(10.0), "ruptures": c.z_min}.get(c.library, 0.5)
            out.append((LIBRARY, self.L, 0.0, floor))
        return out

    def _judge(self, ts: float, value: float, detect: bool) -> Verdict:
        c = self.config
        level_values = self._recent(ts - c.level_seconds)
        level = statistics.median(level_values) if level_values else value
        best = Verdict(alarm=False, score=0.0, baseline=self.B)
        for k, x, base, start_floor in self._channels(value, level):
            channel, direction = KEYS[k]
            if math.isnan(base) or math.isnan(start_floor):
                continue
            d = direction * (x - base)
            if d > start_floor:
                if not self.excursion[k]:
                    self.excursion[k] = True
                    self.ref[k] = max(self.ref_week[k], self.today[k])
                # a drift detector's signal is its own verdict: no record to beat, but the value must still be rare
                signal = k == LIBRARY and c.library in ("page_hinkley", "adwin")
                threshold = start_floor if signal else max(start_floor, (1.0 + c.margin) * self.ref[k])
                # a seasonal, discord, drift or library channel has no verdict before it holds a whole day's record
                established = k < 4 or self.ref_week[k] > 0 or signal
                rare = (
                    direction * x > self.rare_above[k]
                    if k != LIBRARY
                    else (
                        value > self.rare_above[0]
                        or -value > self.rare_above[1]
                        or level > self.rare_above[2]
                        or -level > self.rare_above[3]
                    )
                )
                if not self.on[k] and d > threshold and rare and detect and established:
                    self.on[k] = True
                    best.new = True
                score = 1.0 if self.on[k] else min(1.0, d / threshold)
            else:
                self.excursion[k] = self.on[k] = False
                score = max(0.0, d / start_floor) * 0.5 if start_floor > 0 else 0.0
            if score > best.score:
                best.score, best.channel, best.direction, best.deviation = score, channel, direction, x - base
                best.baseline = base
            if d > self.today[k]:
                self.today[k] = d
        # a CUSUM starts again from zero once it has alarmed (the hold keeps the alarm raised): it signals a drift,
        # it does not stay raised for as long as the series stays away from a baseline that is catching up
        if self.on[DRIFT_UP]:
            self.G_up = 0.0
        if self.on[DRIFT_DOWN]:
            self.G_down = 0.0
        return best

    # --- memory -----------------------------------------------------------------------------------------

    def _close_block(self) -> None:
        c = self.config
        # the hour's readings include the one at its first second: ``block_start - 1e-9`` rounds back to
        # ``block_start`` at epoch magnitudes, which left every hour of an hourly series empty (it never learnt)
        values = self._recent(self.block_start, inclusive=True)
        if not values or not math.isfinite(self.cur_hi):
            self.cur_hi, self.cur_lo = -math.inf, math.inf
            return
        med = statistics.median(values)
        spread = sum(abs(v - med) for v in values) / len(values)
        self.ring[self.ring_head] = (med, self.cur_hi, self.cur_lo, spread)
        self.ring_head = (self.ring_head + 1) % c.memory_blocks
        self.ring_n = min(self.ring_n + 1, c.memory_blocks)
        self.cur_hi, self.cur_lo = -math.inf, math.inf
        self.blocks += 1
        if self.blocks % c.baseline_blocks == 0:
            self.days[self.days_head] = self.today
            self.days_head = (self.days_head + 1) % len(self.days)
            self.days_n = min(self.days_n + 1, len(self.days))
            self.today = [0.0] * K
        self._derive()

    def _last_blocks(self, count: int) -> np.ndarray:
        n = min(count, self.ring_n)
        idx = (self.ring_head - 1 - np.arange(n)) % self.config.memory_blocks
        return self.ring[idx].astype(np.float64)

    def _derive(self) -> None:
        """Baseline, spread, the week's records and rarity thresholds: recomputed once an hour."""
        c = self.config
        day = self._last_blocks(c.baseline_blocks)
        medians = day[:, 0].tolist()
        self.B = statistics.median(medians)
        within = statistics.median(day[:, 3].tolist())
        between = statistics.median([abs(m - self.B) for m in medians])
        floor = 1e-9 * max(abs(self.B), 1.0)
        self.S = max(within, between, floor)
        week = self._last_blocks(c.memory_blocks)
        if self.days_n:
            self.ref_week = [float(v) for v in self.days[: self.days_n].max(axis=0)]
        n = len(week)
        j = math.ceil(c.alpha * n)
        columns = (week[:, 1], -week[:, 2], week[:, 0], -week[:, 0])  # reading up/down, level up/down
        for k, column in enumerate(columns):
            # rare: reached in fewer than alpha·n hours, i.e. beyond the j-th largest; no veto below 1/alpha hours
            self.rare_above[k] = float(np.partition(column, n - j)[n - j]) if c.alpha * n >= 1 else -math.inf
        # where the level is heading must be as rare as a level would have to be
        self.rare_above[TREND_UP], self.rare_above[TREND_DOWN] = self.rare_above[2], self.rare_above[3]
        self.rare_above[SLOW_UP], self.rare_above[SLOW_DOWN] = self.rare_above[2], self.rare_above[3]
        if c.library == "ruptures":
            # below z_min / (1 + margin) spreads a shift can neither start an excursion nor raise the bar for one
            self.L = _change_point(
                week[: 2 * c.baseline_blocks, 0][::-1], self.S, gate=c.z_min / (1.0 + c.margin)
            )
        if c.slow:
            medians = week[:, 0]
            self.M = float(np.median(medians))
            self.SM = max(float(np.median(np.abs(medians - self.M))), within, floor)
        if c.trend_blocks and len(week) >= c.trend_blocks:
            recent = week[: c.trend_blocks, 0][::-1]  # the last hours' medians, oldest first
            hours = np.arange(c.trend_blocks, dtype=np.float64)
            self.T = float(np.polyfit(hours, recent, 1)[0])
        history = week[::-1, 0]  # hourly medians, oldest first
        if c.seasonal == "stl":
            self.E, self.SE = _seasonal_stl(history, c.baseline_blocks, max(within, floor))
        elif c.seasonal == "weekly":
            self.E, self.SE = _seasonal(history, 7 * c.baseline_blocks, max(within, floor))
        elif c.seasonal:
            self.E, self.SE = _seasonal(history, c.baseline_blocks, max(within, floor))
        if c.discord_blocks:
            self.D = _discord(history, c.discord_blocks, self.S)

    # --- state ------------------------------------------------------------------------------------------

    def _arrays(self):
        return (self.ring, self.days, self.recent_t, self.recent_v)

    def to_bytes(self) -> bytes:
        if self.model is not None:
            raise ValueError(
                f"a detector with river's {self.config.library} keeps state to_bytes cannot carry"
            )
        scalars = [float(getattr(self, name)) for name in _SCALARS]
        for name in _PER_KEY:
            scalars += [float(v) for v in getattr(self, name)]
        head = _MAGIC + struct.pack(f"<I{len(scalars)}d", len(scalars), *scalars)
        return b"".join((head, *(array.tobytes() for array in self._arrays())))

    @classmethod
    def from_bytes(cls, blob: bytes, config: DetectorConfig = CONFIG) -> "StreamingDetector":
        """The detector ``to_bytes`` wrote. Raises ValueError for anything else (or another configuration's)."""
        if blob[:4] != _MAGIC or len(blob) < 8:
            raise ValueError("not a detector state")
        (count,) = struct.unpack_from("<I", blob, 4)
        layout = _layout(config)
        if count != _COUNT or len(blob) != 8 + 8 * count + sum(size for *_, size in layout):
            raise ValueError("detector state has the wrong size (another configuration?)")
        detector = cls.__new__(cls)
        detector.model = None
        detector.config = config
        values = struct.unpack_from(f"<{count}d", blob, 8)
        for name, value in zip(_SCALARS, values, strict=False):
            setattr(detector, name, int(value) if name in _INTEGERS else value)
        rest = list(values[len(_SCALARS) :])
        for i, name in enumerate(_PER_KEY):
            part = rest[i * K : (i + 1) * K]
            setattr(detector, name, [bool(v) for v in part] if name in ("excursion", "on") else part)
        buffer = bytearray(blob)  # one copy; the arrays are writable views into it
        offset = 8 + 8 * count
        for name, dtype, shape, size in layout:
            setattr(detector, name, np.frombuffer(buffer, dtype, math.prod(shape), offset).reshape(shape))
            offset += size
        return detector


def _seasonal(history: np.ndarray, period: int, within: float) -> tuple[float, float]:
    """The coming hour's expected median (the median of the same hour on the past periods kept: days, or weeks)
    and the spread of the last period's hours about their own expectation; NaN until two whole periods are kept."""
    n = len(history)
    if n < 2 * period:
        return math.nan, math.nan
    lags = period * np.arange(1, n // period + 1)
    expected = float(np.median(history[n - lags[lags <= n]]))
    hours = (n - period) + np.arange(period)
    before = hours[None, :] - lags[:-1, None]
    profile = np.where(before >= 0, history[np.maximum(before, 0)], np.nan)
    valid = ~np.all(np.isnan(profile), axis=0)
    if not valid.any():
        return math.nan, math.nan
    residual = history[hours[valid]] - np.nanmedian(profile[:, valid], axis=0)
    return expected, max(float(np.median(np.abs(residual))), within)


def _seasonal_stl(history: np.ndarray, period: int, within: float) -> tuple[float, float]:
    """As ``_seasonal``, by a seasonal-trend decomposition (statsmodels' STL) of the hours kept: the coming
    hour's expectation is the last trend plus the seasonal component a period back."""
    from statsmodels.tsa.seasonal import STL

    n = len(history)
    if n < 2 * period + 1:
        return math.nan, math.nan
    fit = STL(history, period=period).fit()
    residual = np.asarray(fit.resid)[-period:]
    return float(fit.trend[-1] + fit.seasonal[n - period]), max(float(np.median(np.abs(residual))), within)


def _discord(history: np.ndarray, length: int, spread: float) -> float:
    """How far (RMS, in spreads) the last ``length`` hours' shape is from the nearest earlier stretch of the
    memory, outside the trivial-match zone: the left matrix profile's newest value (stumpy's MASS)."""
    import stumpy

    n = len(history)
    start = n - length
    exclusion = math.ceil(length / 4)
    reach = start - exclusion  # earlier stretches begin before this
    if reach < 2 * length:
        return 0.0
    distances = stumpy.mass(history[start:], history[: reach - 1 + length], normalize=False)
    return float(np.min(distances)) / math.sqrt(length) / spread


def _change_point(history: np.ndarray, spread: float, recent: int = 6, gate: float = 0.0) -> float:
    """The size (in spreads) of the mean shift at the best single change point of these hourly medians (ruptures'
    binary segmentation, least squares), if that change point lies in the last ``recent`` hours; else 0. When no
    split in the last hours shifts the mean by ``gate`` spreads, the answer cannot reach it and ruptures (tens of
    milliseconds a call) is not asked: 0."""
    n = len(history)
    if n < 4 * recent:
        return 0.0
    sums = np.cumsum(history)
    splits = np.arange(n - recent, n - 1)  # ruptures' min_size 2: at most n - 2
    before, after = sums[splits - 1] / splits, (sums[-1] - sums[splits - 1]) / (n - splits)
    if float(np.max(np.abs(after - before))) < gate * spread:
        return 0.0
    import ruptures

    (split, _) = ruptures.Binseg(model="l2", min_size=2, jump=1).fit(history.reshape(-1, 1)).predict(n_bkps=1)
    if split < n - recent:
        return 0.0
    return abs(float(history[split:].mean() - history[:split].mean())) / spread


def _river_model(name: str):
    from river import anomaly, drift

    if name == "half_space_trees":
        return anomaly.HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=1)
    return drift.PageHinkley() if name == "page_hinkley" else drift.ADWIN()


_INTEGERS = frozenset(("blocks", "ring_head", "ring_n", "days_head", "days_n", "recent_head", "recent_n"))
_COUNT = len(_SCALARS) + len(_PER_KEY) * K


def _layout(config: DetectorConfig) -> list[tuple[str, type, tuple, int]]:
    days = config.memory_blocks // config.baseline_blocks
    shapes = (
        ("ring", np.float32, (config.memory_blocks, 4)),
        ("days", np.float32, (days, K)),
        ("recent_t", np.float64, (config.level_readings,)),
        ("recent_v", np.float64, (config.level_readings,)),
    )
    return [
        (name, dtype, shape, np.dtype(dtype).itemsize * math.prod(shape)) for name, dtype, shape in shapes
    ]


def alarm_intervals(timestamps, alarms) -> list[tuple[float, float]]:
    """Runs of consecutive alarmed readings as (first, last) timestamps: the detected intervals."""
    intervals: list[list[float]] = []
    previous = False
    for ts, alarm in zip(timestamps, alarms, strict=True):
        if alarm:
            if previous:
                intervals[-1][1] = ts
            else:
                intervals.append([ts, ts])
        previous = alarm
    return [(a, b) for a, b in intervals]
