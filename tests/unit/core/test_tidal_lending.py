"""The day-lending guard's control law: it backs off at once, returns one step per clean window, and
cannot oscillate faster than its window (a property over arbitrary measurement sequences); and the
plane's P2 request admission by DAY under ``strict`` and ``lending`` on a real `LeaseController`."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P2, ManualClock, OutcomeCode
from gpupool.core.controller import Backend, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.tidal.lending import GuardConfig, LendingGuard
from gpupool.core.tidal.plane import PlaneConfig, TidalPlane, p2_usage_of, plane_config
from tests.builders import a_request, a_slice

W = 300.0
CFG = GuardConfig(window_s=W, slo_ttft_s=0.8, target=0.99, steps=4, min_samples=5)


def feed(g: LendingGuard, t: float, good: int, bad: int) -> None:
    for _ in range(good):
        g.observe(t, 0.1)
    for _ in range(bad):
        g.observe(t, 2.0)


def test_backs_off_at_once_and_returns_one_step_per_clean_window() -> None:
    g = LendingGuard(CFG)
    t = 0.0
    levels = []
    for _ in range(6):
        feed(g, t, 10, 0)
        g.update(t)
        levels.append(g.level)
        t += W
    assert levels == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    feed(g, t, 10, 1)  # one miss in 11: attainment 0.909 < 0.99
    ch = g.update(t)
    assert ch is not None and ch.level_to == 0.0 and g.level == 0.0
    feed(g, t + 1, 50, 0)
    g.update(t + W - 1)  # still calm: a full fresh window has not passed
    assert g.level == 0.0
    feed(g, t + W, 50, 0)
    g.update(t + W)
    assert g.level == 0.25


def test_no_evidence_no_move_and_admission_follows_the_level() -> None:
    g = LendingGuard(CFG)
    feed(g, 0.0, 4, 0)
    assert g.update(0.0) is None and g.level == 0.0  # 4 < min_samples
    assert not any(g.admit() for _ in range(10))
    feed(g, 1.0, 1, 0)
    g.update(1.0)
    assert g.level == 0.25
    admitted = sum(g.admit() for _ in range(100))
    assert admitted == 25
    with pytest.raises(InvalidInput, match="at_s"):
        g.update(0.5)


@settings(max_examples=300, deadline=None)
@example(
    [(0.0, 10, 0, True), (10.0, 0, 1, False), (240.0, 0, 0, True), (50.0, 10, 0, False), (11.0, 0, 0, True)]
)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 400.0), st.integers(0, 30), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=80,
    )
)
def test_it_cannot_oscillate_faster_than_its_window(steps: list[tuple[float, int, int, bool]]) -> None:
    g = LendingGuard(CFG)
    t = 0.0
    for dt, good, bad, update in steps:  # measurements may arrive between two updates
        t += dt
        feed(g, t, good, bad)
        if update:
            g.update(t)
    raises = [c.at for c in g.changes if c.level_to > c.level_from]
    falls = [c.at for c in g.changes if c.level_to < c.level_from]
    assert all(b - a >= W for a, b in pairwise(raises))
    assert all(b - a >= W for a, b in pairwise(falls))
    for f in falls:  # every raise after a back-off comes a full window later
        later = [r for r in raises if r > f]
        assert not later or later[0] - f >= W
    for a, b in pairwise(g.changes):  # no two changes in the same direction
        assert (a.level_to > a.level_from) != (b.level_to > b.level_from) or b.at - a.at >= W
    assert all(c.level_to == 0.0 for c in g.changes if c.level_to < c.level_from)


ZONE = "UTC"


def a_plane(policy: str) -> tuple[LeaseController, TidalPlane, ManualClock]:
    clock = ManualClock(datetime(2026, 3, 2, 12, tzinfo=ZoneInfo(ZONE)).timestamp())
    c = LeaseController([a_slice("g0", gpu="g0")], clock=clock, store=MemoryLeaseStore())
    c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=10_000))
    cfg = plane_config(
        {"timezone": ZONE, "initial_baseline": 60.0, "day_policy": policy, "lending_min_samples": 5}
    )
    plane = TidalPlane(cfg, clock=clock, p2_usage=p2_usage_of(c.allocator))
    c.admission_hook = plane
    return c, plane, clock


def req(rid: str, prio: int) -> object:
    return replace(a_request(rid, vram_mib=10, priority=prio), model="m")


def test_strict_day_keeps_p2_requests_out_of_online_engines() -> None:
    c, plane, _ = a_plane("strict")
    out = c.acquire(req("p2", P2))  # type: ignore[arg-type]
    assert out.code is OutcomeCode.SHED and "strict" in out.reason
    assert c.acquire(req("p0", P0)).granted  # type: ignore[arg-type]
    assert plane.refusals["day-strict"] == 1


def test_lending_day_lets_p2_requests_in_at_the_guards_level() -> None:
    c, plane, clock = a_plane("lending")
    assert c.acquire(req("x0", P2)).code is OutcomeCode.SHED  # type: ignore[arg-type]  # level 0
    for _ in range(10):
        plane.observe_ttft(0.2)
    plane.tick()
    assert plane.guard.level == 0.25
    got = [c.acquire(req(f"x{i}", P2)).granted for i in range(1, 9)]  # type: ignore[arg-type]
    assert sum(got) == 2
    view = plane.view()["lending"]
    assert isinstance(view, dict) and view["level"] == 0.25 and view["p0_ttft_attainment"] == 1.0
    plane.observe_ttft(5.0)  # a breach: 10/11 < 0.99
    clock.advance(1)
    plane.tick()
    assert plane.guard.level == 0.0
    assert [ch.level_to for ch in plane.lending_changes] == [0.25, 0.0]


def test_lending_settings_are_checked() -> None:
    with pytest.raises(InvalidInput, match=r"tidal\.day_policy"):
        PlaneConfig(day_policy="greedy")
    with pytest.raises(InvalidInput, match=r"tidal\.lending_target"):
        plane_config({"lending_target": 1.5})
