"""Unit tests of the tidal mode machine (gpupool.core.tidal) on a virtual wall clock."""

from __future__ import annotations

import itertools
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpupool.core import InvalidInput, ManualClock
from gpupool.core.tidal import CompressedClock, Mode, TidalConfig, TidalController

TZ = ZoneInfo("Asia/Shanghai")
MIN = 60.0


def at(day: int, hh: int, mm: int = 0, tz: ZoneInfo = TZ) -> float:
    """Unix seconds of local time 2026-03-(2+day) hh:mm (a Monday for day 0)."""
    return datetime(2026, 3, 2 + day, hh, mm, tzinfo=tz).timestamp()


def feed(ctl: TidalController, start: float, end: float, demand, step: float = MIN) -> list:
    """Sample ``demand(t)`` every ``step`` seconds on [start, end); return the transitions."""
    out = []
    t = start
    while t < end:
        tr = ctl.observe(t, demand(t) if callable(demand) else demand)
        if tr is not None:
            out.append(tr)
        t += step
    return out


def learnt(cfg: TidalConfig | None = None, level: float = 100.0) -> TidalController:
    """A controller that has seen one full day window at ``level``."""
    ctl = TidalController(cfg or TidalConfig())
    feed(ctl, at(0, 8, 30), at(0, 19, 30), level)
    return ctl


# ----------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"day_start": "8h30"}, "tidal.day_start"),
        ({"night_end": "25:00"}, "tidal.night_end"),
        ({"timezone": "Mars/Olympus"}, "tidal.timezone"),
        ({"enter_ratio": 0.5, "exit_ratio": 0.3}, "tidal.enter_ratio"),
        ({"enter_hold_s": 0}, "tidal.enter_hold_s"),
        ({"day_reserved_fraction": 1.5}, "tidal.day_reserved_fraction"),
        ({"night_start": "12:00"}, "tidal.night_start"),
        ({"day_start": "10:00", "day_end": "10:00"}, "tidal.day_end"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(InvalidInput) as e:
        TidalConfig(**kwargs)
    assert e.value.field == field


def test_bad_samples_are_rejected_and_state_kept():
    ctl = learnt()
    before = ctl.snapshot(at(0, 19, 30))
    for bad in (-1.0, float("nan"), True):
        with pytest.raises(InvalidInput):
            ctl.observe(at(0, 19, 31), bad)
    with pytest.raises(InvalidInput, match="back in time"):
        ctl.observe(at(0, 10), 5.0)
    assert ctl.snapshot(at(0, 19, 30)) == before


# ----------------------------------------------------------------- schedule windows


def test_window_boundaries_are_half_open_and_wrap_midnight():
    ctl = TidalController()
    assert ctl.in_day_window(at(0, 8, 30)) and not ctl.in_day_window(at(0, 8, 29))
    assert ctl.in_day_window(at(0, 19, 29)) and not ctl.in_day_window(at(0, 19, 30))
    assert ctl.in_night_window(at(0, 20, 0)) and not ctl.in_night_window(at(0, 19, 59))
    assert ctl.in_night_window(at(1, 0, 0)) and ctl.in_night_window(at(1, 6, 59))
    assert not ctl.in_night_window(at(1, 7, 0))


def test_time_zone_is_configurable():
    utc = TidalController(TidalConfig(timezone="UTC"))
    sh = TidalController()
    t = at(0, 20, 0, tz=ZoneInfo("UTC"))  # 20:00 UTC = 04:00 next day in Shanghai
    assert utc.in_night_window(t) and sh.in_night_window(t)
    t = at(0, 12, 0, tz=ZoneInfo("UTC"))  # 12:00 UTC = 20:00 Shanghai
    assert not utc.in_night_window(t) and sh.in_night_window(t)


# ----------------------------------------------------------------- baseline


def test_no_baseline_means_no_lending():
    ctl = TidalController()
    assert feed(ctl, at(0, 20), at(1, 7), 0.0) == []
    assert ctl.mode is Mode.DAY and ctl.baseline() is None


def test_initial_baseline_enables_the_first_night():
    ctl = TidalController(TidalConfig(initial_baseline=100.0))
    trs = feed(ctl, at(0, 20), at(1, 7, 1), 1.0)
    assert [t.mode_to for t in trs] == [Mode.NIGHT, Mode.DAY]


def test_baseline_learns_from_day_window_only():
    ctl = TidalController()
    feed(ctl, at(0, 0), at(0, 8, 30), 1000.0)  # night-time samples: ignored
    feed(ctl, at(0, 8, 30), at(0, 19, 30), 100.0)
    feed(ctl, at(0, 19, 30), at(1, 7), 1000.0)
    b = ctl.baseline()
    assert b is not None and b == pytest.approx(100.0, rel=1e-6)


def test_baseline_is_a_slow_ewma():
    ctl = learnt(level=100.0)
    feed(ctl, at(1, 8, 30), at(1, 19, 30), 200.0)  # one day at double the level
    b = ctl.baseline()
    assert b is not None and 130.0 < b < 200.0


# ----------------------------------------------------------------- the 30-minute trigger


def test_enters_night_after_exactly_30_low_minutes_inside_the_window():
    ctl = learnt()
    # drops to 5 % at 21:00; smoothing (5 min) makes the smoothed value fall below 10 % a bit later
    trs = feed(ctl, at(0, 19, 30), at(0, 21), 100.0) + feed(ctl, at(0, 21), at(0, 23), 5.0)
    assert len(trs) == 1 and trs[0].mode_to is Mode.NIGHT and trs[0].reason == "traffic-low"
    low_start = ctl.transitions[0].at - 1800
    assert at(0, 21) <= low_start <= at(0, 21, 15)


def test_low_stretch_before_window_counts_but_never_enters_outside_it():
    ctl = learnt()
    trs = feed(ctl, at(0, 19, 30), at(0, 20, 30), 0.0)
    # smoothed demand is under 10 % from ~19:42; the stretch counts from there, not from 20:00
    assert len(trs) == 1 and at(0, 20, 0) <= trs[0].at < at(0, 20, 15)
    sharp = learnt(TidalConfig(smooth_tau_s=1.0))  # near-unsmoothed: low from 19:30 sharp
    trs = feed(sharp, at(0, 19, 30), at(0, 20, 30), 0.0)
    assert len(trs) == 1 and trs[0].at == at(0, 20, 0)  # 30 low minutes, entered as the window opens


def test_a_single_busy_minute_does_not_break_smoothed_low():
    ctl = learnt()
    demand = lambda t: 40.0 if at(0, 21, 10) <= t < at(0, 21, 11) else 1.0  # noqa: E731
    trs = feed(ctl, at(0, 20), at(0, 22), demand)
    assert [t.mode_to for t in trs] == [Mode.NIGHT]


def test_sustained_interruption_restarts_the_30_minutes():
    ctl = learnt()
    feed(ctl, at(0, 19, 30), at(0, 20), 100.0)
    feed(ctl, at(0, 20), at(0, 20, 25), 1.0)
    assert ctl.mode is Mode.DAY
    feed(ctl, at(0, 20, 25), at(0, 20, 45), 50.0)  # 20 min at 50 %: breaks the stretch
    assert ctl.mode is Mode.DAY and ctl.snapshot(at(0, 20, 45)).low_since is None
    trs = feed(ctl, at(0, 20, 45), at(0, 22), 1.0)
    assert len(trs) == 1 and trs[0].at - at(0, 20, 45) >= 1800


def test_demand_just_above_threshold_is_not_low():
    ctl = learnt()
    feed(ctl, at(0, 19, 30), at(0, 20), 10.1)
    assert feed(ctl, at(0, 20), at(1, 7), 10.1) == []  # 10.1 % of the baseline is not "under 10 %"


# ----------------------------------------------------------------- returning to DAY


def test_schedule_boundary_returns_to_day_at_07_00():
    ctl = learnt()
    trs = feed(ctl, at(0, 19, 30), at(1, 8), 1.0)
    assert [(t.mode_to, t.reason) for t in trs] == [(Mode.NIGHT, "traffic-low"), (Mode.DAY, "schedule")]
    assert trs[1].at == at(1, 7, 0)


def test_sustained_online_demand_returns_to_day_but_a_burst_does_not():
    ctl = learnt()
    feed(ctl, at(0, 19, 30), at(0, 22), 1.0)
    assert ctl.mode is Mode.NIGHT
    burst = lambda t: 400.0 if at(0, 22) <= t < at(0, 22, 1) else 1.0  # noqa: E731
    assert feed(ctl, at(0, 22), at(0, 23), burst) == []
    trs = feed(ctl, at(0, 23), at(0, 23, 30), 60.0)
    assert len(trs) == 1 and trs[0].reason == "traffic-high" and trs[0].mode_to is Mode.DAY


def test_no_flapping_under_oscillating_demand():
    ctl = learnt()
    feed(ctl, at(0, 19, 30), at(0, 20), 100.0)

    def square(t: float) -> float:  # 20 min high, 20 min low, all night
        return 80.0 if int((t - at(0, 20)) // 1200) % 2 == 0 else 0.0

    trs = feed(ctl, at(0, 20), at(1, 7), square)
    assert trs == []  # low never lasts 30 min

    def slow(t: float) -> float:  # 45 min low, 15 min high
        return 0.0 if (t - at(1, 20)) % 3600 < 2700 else 80.0

    ctl2 = learnt()
    feed(ctl2, at(0, 19, 30), at(0, 20), 100.0)
    trs2 = feed(ctl2, at(0, 20), at(1, 7), slow)
    entries = [t.at for t in trs2 if t.mode_to is Mode.NIGHT]
    assert len(trs2) <= 2 * 11
    gaps = [b - a for a, b in itertools.pairwise(entries)]
    assert all(g >= 1800 + 300 for g in gaps)


def test_p2_share_follows_the_mode():
    ctl = learnt()
    assert ctl.p2_share() == pytest.approx(0.2)
    feed(ctl, at(0, 19, 30), at(0, 22), 1.0)
    assert ctl.p2_share() == pytest.approx(0.75)


def test_transitions_are_recorded_in_order():
    ctl = learnt()
    feed(ctl, at(0, 19, 30), at(2, 8), lambda t: 100.0 if ctl.in_day_window(t) else 1.0)
    modes = [t.mode_to for t in ctl.transitions]
    assert modes == [Mode.NIGHT, Mode.DAY, Mode.NIGHT, Mode.DAY]
    assert all(a.at < b.at for a, b in itertools.pairwise(ctl.transitions))


# ----------------------------------------------------------------- compressed clock


def test_compressed_clock_runs_a_day_in_ten_minutes():
    base = ManualClock(1000.0)
    c = CompressedClock(base, origin_s=at(0, 0), speed=144.0)
    assert c.now() == at(0, 0)
    base.advance(600.0)
    assert c.now() == pytest.approx(at(1, 0))
    with pytest.raises(InvalidInput):
        CompressedClock(base, origin_s=0.0, speed=0.0)
