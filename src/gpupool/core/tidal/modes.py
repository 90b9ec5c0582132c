"""Tidal mode controller: a pure state machine that decides DAY (online first) or NIGHT (lend to P2).

Role: the core half of tidal time-sharing. Adapters feed it online demand samples and the wall
clock; it answers which mode the pool is in, why it changed, and how much capacity P2 may hold.
It performs no I/O and never reads a clock: every call carries its own time (Unix seconds). A
sample has two readings: ``at_s`` on a time line that never steps (holds, dwell and smoothing are
measured on it) and ``wall_s``, the wall clock, converted to local time with `zoneinfo` in the
configured time zone to decide the schedule windows (default: ``at_s``, one clock for both). So a
wall-clock step moves the schedule (day and night follow the corrected time of day at once) but
stretches or cuts no hold.

Rules (defaults from the seed, all configurable and validated in `TidalConfig`):
- Schedule: ``DAY`` window 08:30-19:30 and ``NIGHT`` window 20:00-07:00 (local time). The pool is
  never in NIGHT outside the night window; the night window ending (07:00) always returns it to DAY
  ("at the schedule boundary"), so re-partitioned capacity is handed back before the day window.
- Traffic trigger (enter NIGHT): inside the night window, once the *smoothed* online (P0+P1) demand
  has stayed below ``enter_ratio`` (10 %) of the learnt baseline for ``enter_hold_s`` (30 min)
  without interruption. The low stretch may start before 20:00; it is broken by any sample at or
  above the threshold.
- Traffic trigger (return to DAY): smoothed demand above ``exit_ratio`` (30 %) of the baseline for
  ``exit_hold_s`` (5 min). Single P0 arrivals at night are *not* a reason to leave NIGHT: they are
  served by the night paths (free capacity, P2 holdback, pausers).
- Hysteresis (never flaps): ``enter_ratio < exit_ratio``; every return to DAY clears the low
  stretch and NIGHT needs ``min_day_dwell_s`` (30 min) in DAY as well as a fresh full low stretch,
  so two NIGHT entries are at least ``max(min_day_dwell_s, enter_hold_s) + exit_hold_s`` apart.
- Baseline: a bias-corrected EWMA of the demand samples taken inside the *day window* only, with a
  time constant of ``baseline_tau_s`` (two days of day-window time). Learning only from daytime is
  deliberate: a same-hour-of-night baseline would make night traffic ~100 % of its own baseline and
  the 10 % trigger could never fire. Until ``baseline_min_s`` of day-window samples have been seen
  (or ``initial_baseline`` is given) traffic triggers are off and the pool stays in DAY (safe).
- Smoothing: demand is an EWMA with time constant ``smooth_tau_s`` (5 min), so one quiet or one busy
  minute does not switch the mode.

Capacity shares: DAY keeps at least ``day_reserved_fraction`` (80 %) of pool capacity for P0/P1, so
P2 may hold at most ``1 - day_reserved_fraction``; NIGHT lends everything except
``night_reserved_fraction`` (the warm online reserve). `TidalController.p2_share` returns it.

Invariants: mode changes only inside `observe`; every change is returned as a `TidalTransition`
(and kept in ``transitions``); samples must arrive in non-decreasing ``at_s`` order (`InvalidInput`
otherwise, state unchanged); ``wall_s`` may step either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from datetime import time as dtime
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput
from gpupool.core.tidal.numbers import finite_number


class Mode(StrEnum):
    DAY = "day"
    NIGHT = "night"


def parse_hhmm(value: object, *, field: str) -> dtime:
    """``"08:30"`` -> `datetime.time`; `InvalidInput` naming ``field`` otherwise. An integer is what
    YAML 1.1 makes of an unquoted ``19:30`` (base 60: 1170): refused, naming the time as written."""
    if type(value) is int and 0 <= value < 24 * 60:
        as_written = f"{value // 60}:{value % 60:02d}"
        raise InvalidInput(
            field,
            value,
            f"expected HH:MM (24-hour local time) in quotes: YAML reads an unquoted {as_written} "
            f"as the number {value}",
        )
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        hh, mm = value.strip().split(":")
        return dtime(int(hh), int(mm))
    except ValueError:
        raise InvalidInput(field, value, "expected HH:MM (24-hour local time)") from None


def _in_window(t: dtime, start: dtime, end: dtime) -> bool:
    """Half-open ``[start, end)``; a window with ``end < start`` wraps past midnight."""
    if start <= end:
        return start <= t < end
    return t >= start or t < end


def _positive(name: str, value: float) -> None:
    if not finite_number(value):
        raise InvalidInput(f"tidal.{name}", value, "must be a finite number")
    if value <= 0:
        raise InvalidInput(f"tidal.{name}", value, "must be > 0")


@dataclass(frozen=True, slots=True)
class TidalConfig:
    day_start: str = "08:30"
    day_end: str = "19:30"
    night_start: str = "20:00"
    night_end: str = "07:00"
    timezone: str = "Asia/Shanghai"
    enter_ratio: float = 0.10
    enter_hold_s: float = 1800.0
    exit_ratio: float = 0.30
    exit_hold_s: float = 300.0
    min_day_dwell_s: float = 1800.0
    smooth_tau_s: float = 300.0
    baseline_tau_s: float = 2 * 11 * 3600.0
    baseline_min_s: float = 3600.0
    initial_baseline: float | None = None
    day_reserved_fraction: float = 0.80
    night_reserved_fraction: float = 0.25

    def __post_init__(self) -> None:
        windows = {
            name: parse_hhmm(getattr(self, name), field=f"tidal.{name}")
            for name in ("day_start", "day_end", "night_start", "night_end")
        }
        if windows["day_start"] == windows["day_end"]:
            raise InvalidInput("tidal.day_end", self.day_end, "the day window must not be empty")
        if windows["night_start"] == windows["night_end"]:
            raise InvalidInput("tidal.night_end", self.night_end, "the night window must not be empty")
        if _in_window(windows["night_start"], windows["day_start"], windows["day_end"]) or _in_window(
            windows["day_start"], windows["night_start"], windows["night_end"]
        ):
            raise InvalidInput(
                "tidal.night_start", self.night_start, "the night window must not overlap the day window"
            )
        if not isinstance(self.timezone, str):
            raise InvalidInput("tidal.timezone", self.timezone, "must be an IANA time zone name")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # (OSError: a name too long for a file)
            raise InvalidInput("tidal.timezone", self.timezone, "unknown IANA time zone") from None
        for name in ("enter_hold_s", "exit_hold_s", "smooth_tau_s", "baseline_tau_s", "baseline_min_s"):
            _positive(name, getattr(self, name))
        if not finite_number(self.min_day_dwell_s) or self.min_day_dwell_s < 0:
            raise InvalidInput("tidal.min_day_dwell_s", self.min_day_dwell_s, "must be finite and >= 0")
        for name in ("enter_ratio", "exit_ratio"):
            if not finite_number(getattr(self, name)):
                raise InvalidInput(f"tidal.{name}", getattr(self, name), "must be a finite number")
        if not 0 < self.enter_ratio < self.exit_ratio:
            raise InvalidInput(
                "tidal.enter_ratio",
                self.enter_ratio,
                f"must satisfy 0 < enter_ratio < exit_ratio ({self.exit_ratio})",
            )
        if self.initial_baseline is not None:
            _positive("initial_baseline", self.initial_baseline)
        for name in ("day_reserved_fraction", "night_reserved_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1:
                raise InvalidInput(f"tidal.{name}", v, "must be a number in [0, 1]")

    def windows(self) -> tuple[dtime, dtime, dtime, dtime]:
        return (
            parse_hhmm(self.day_start, field="tidal.day_start"),
            parse_hhmm(self.day_end, field="tidal.day_end"),
            parse_hhmm(self.night_start, field="tidal.night_start"),
            parse_hhmm(self.night_end, field="tidal.night_end"),
        )


@dataclass(frozen=True, slots=True)
class TidalTransition:
    at: float
    """Unix seconds of the sample that caused the change, on the time line (``at_s``)."""
    mode_from: Mode
    mode_to: Mode
    reason: str
    """``schedule`` (window boundary), ``traffic-low`` or ``traffic-high``."""
    demand: float
    baseline: float
    wall_at: float
    """The wall-clock reading of that sample (``wall_s``; the local time to show)."""


@dataclass(frozen=True, slots=True)
class TidalSnapshot:
    mode: Mode
    smoothed_demand: float
    baseline: float | None
    low_since: float | None
    high_since: float | None
    in_day_window: bool
    in_night_window: bool


@dataclass(slots=True)
class _Ewma:
    """Bias-corrected exponentially weighted mean over irregular samples (weight 1 - exp(-dt/tau))."""

    tau_s: float
    raw: float = 0.0
    weight: float = 0.0
    seen_s: float = 0.0

    def update(self, x: float, dt_s: float) -> None:
        if dt_s <= 0:
            return
        a = 1.0 - math.exp(-dt_s / self.tau_s)
        self.raw += a * (x - self.raw)
        self.weight += a * (1.0 - self.weight)
        self.seen_s += dt_s

    def get(self) -> float:
        return self.raw / self.weight if self.weight > 0 else 0.0


class TidalController:
    """The mode machine. Feed it with `observe(at_s, demand)`; read `mode` and `p2_share`."""

    def __init__(self, config: TidalConfig | None = None) -> None:
        self.config = config or TidalConfig()
        self.mode = Mode.DAY
        self.transitions: list[TidalTransition] = []
        self._zone = ZoneInfo(self.config.timezone)
        self._windows = self.config.windows()
        self._baseline = _Ewma(self.config.baseline_tau_s)
        self._last_at: float | None = None
        self._smooth: float | None = None
        self._low_since: float | None = None
        self._high_since: float | None = None
        self._day_since: float | None = None

    # ----------------------------------------------------------------- queries
    def local_time(self, at_s: float) -> datetime:
        return datetime.fromtimestamp(at_s, tz=self._zone)

    def in_day_window(self, at_s: float) -> bool:
        d0, d1, _, _ = self._windows
        return _in_window(self.local_time(at_s).time(), d0, d1)

    def in_night_window(self, at_s: float) -> bool:
        _, _, n0, n1 = self._windows
        return _in_window(self.local_time(at_s).time(), n0, n1)

    def baseline(self) -> float | None:
        """The learnt daytime demand level, or None while it is not yet trusted."""
        b = self._baseline
        if b.weight > 0 and b.seen_s >= self.config.baseline_min_s:
            return b.get()
        return self.config.initial_baseline

    def p2_share(self) -> float:
        """The fraction of pool capacity P2 may hold in the current mode."""
        if self.mode is Mode.NIGHT:
            return 1.0 - self.config.night_reserved_fraction
        return 1.0 - self.config.day_reserved_fraction

    def snapshot(self, at_s: float) -> TidalSnapshot:
        return TidalSnapshot(
            mode=self.mode,
            smoothed_demand=self._smooth or 0.0,
            baseline=self.baseline(),
            low_since=self._low_since,
            high_since=self._high_since,
            in_day_window=self.in_day_window(at_s),
            in_night_window=self.in_night_window(at_s),
        )

    # ----------------------------------------------------------------- input
    def observe(self, at_s: float, demand: float, *, wall_s: float | None = None) -> TidalTransition | None:
        """One sample of online (P0+P1) demand (any non-negative rate: requests/s, tokens/s) at
        ``at_s`` on the time line; the schedule windows are those of ``wall_s`` (default ``at_s``),
        which may step either way between samples.

        Returns the transition it caused, if any.
        """
        wall_s = at_s if wall_s is None else wall_s
        for name, v in (("at_s", at_s), ("wall_s", wall_s)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise InvalidInput(name, v, "must be finite Unix seconds")
        if isinstance(demand, bool) or not isinstance(demand, int | float) or not math.isfinite(demand):
            raise InvalidInput("demand", demand, "must be a finite number")
        if demand < 0:
            raise InvalidInput("demand", demand, "must be >= 0")
        if self._last_at is not None and at_s < self._last_at:
            raise InvalidInput("at_s", at_s, f"samples must not go back in time (last {self._last_at})")
        dt = 0.0 if self._last_at is None else at_s - self._last_at
        self._last_at = at_s
        cfg = self.config
        if self._smooth is None:
            self._smooth = float(demand)
        else:
            self._smooth += (1.0 - math.exp(-dt / cfg.smooth_tau_s)) * (demand - self._smooth)
        day_window = self.in_day_window(wall_s)
        night_window = self.in_night_window(wall_s)
        if day_window:
            self._baseline.update(float(demand), dt)
        if self._day_since is None:
            self._day_since = at_s
        base = self.baseline()
        smooth = self._smooth
        # -- track the low and high stretches (strict comparisons; equality breaks a low stretch)
        if base is not None and smooth < cfg.enter_ratio * base:
            if self._low_since is None:
                self._low_since = at_s
        else:
            self._low_since = None
        if base is not None and smooth > cfg.exit_ratio * base:
            if self._high_since is None:
                self._high_since = at_s
        else:
            self._high_since = None
        # -- decide
        if self.mode is Mode.NIGHT:
            if not night_window:
                return self._switch(at_s, Mode.DAY, "schedule", smooth, base, wall_s=wall_s)
            if self._high_since is not None and at_s - self._high_since >= cfg.exit_hold_s:
                return self._switch(at_s, Mode.DAY, "traffic-high", smooth, base, wall_s=wall_s)
            return None
        if not night_window or base is None or self._low_since is None:
            return None
        dwell_ok = at_s - (self._day_since if self._day_since is not None else at_s) >= cfg.min_day_dwell_s
        if dwell_ok and at_s - self._low_since >= cfg.enter_hold_s:
            return self._switch(at_s, Mode.NIGHT, "traffic-low", smooth, base, wall_s=wall_s)
        return None

    def _switch(
        self, at_s: float, to: Mode, reason: str, demand: float, base: float | None, *, wall_s: float
    ) -> TidalTransition:
        tr = TidalTransition(
            at=at_s,
            mode_from=self.mode,
            mode_to=to,
            reason=reason,
            demand=demand,
            baseline=base or 0.0,
            wall_at=wall_s,
        )
        self.mode = to
        self.transitions.append(tr)
        if to is Mode.DAY:
            self._day_since = at_s
            self._low_since = None
        self._high_since = None
        return tr


class CompressedClock:
    """Wall-clock time that runs ``speed`` times faster than an injected base clock.

    ``now() = origin_s + (base.now() - base_at_start) * speed``: with speed 144 one simulated day
    passes in ten real minutes (the live demo, issue 8 section 6). Pure: it reads only ``base``.
    """

    def __init__(self, base: Clock, *, origin_s: float, speed: float) -> None:
        _positive("speed", speed)
        self._base = base
        self._origin = float(origin_s)
        self._start = base.now()
        self._speed = float(speed)

    @property
    def speed(self) -> float:
        return self._speed

    def now(self) -> float:
        return self._origin + (self._base.now() - self._start) * self._speed


__all__ = [
    "CompressedClock",
    "Mode",
    "TidalConfig",
    "TidalController",
    "TidalSnapshot",
    "TidalTransition",
    "parse_hhmm",
]
