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
from gpupool.core.clock import Clock
from gpupool.core.controller import Backend, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.tidal.lending import GuardConfig, LendingGuard
from gpupool.core.tidal.modes import CompressedClock
from gpupool.core.tidal.plane import (
    MAX_RETRY_AFTER_S,
    PlaneConfig,
    TidalPlane,
    kv_usage_of,
    p2_usage_of,
    plane_config,
)
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
    return (*wired(policy, clock), clock)


def wired(policy: str, clock: Clock) -> tuple[LeaseController, TidalPlane]:
    c = LeaseController([a_slice("g0", gpu="g0")], clock=clock, store=MemoryLeaseStore())
    c.register_backend(Backend("be", "m", "http://x", node="n0", gpu_id="g0", kv_budget_mib=10_000))
    cfg = plane_config(
        {"timezone": ZONE, "initial_baseline": 60.0, "day_policy": policy, "lending_min_samples": 5}
    )
    plane = TidalPlane(cfg, clock=clock, p2_usage=p2_usage_of(c.allocator))
    c.admission_hook = plane
    return c, plane


def req(rid: str, prio: int) -> object:
    return replace(a_request(rid, vram_mib=10, priority=prio), model="m")


def test_strict_day_keeps_p2_requests_out_of_online_engines() -> None:
    c, plane, _ = a_plane("strict")
    out = c.acquire(req("p2", P2))  # type: ignore[arg-type]
    assert out.code is OutcomeCode.SHED and "strict" in out.reason
    assert c.acquire(req("p0", P0)).granted  # type: ignore[arg-type]
    assert plane.refusals["day-strict"] == 1


def test_a_strict_refusal_retries_when_night_can_begin_in_real_seconds() -> None:
    """Retry-After is the wait for the night window (20:00), bounded by an hour; on `gpupool run`'s
    compressed schedule clock it is in real seconds. A NIGHT holdback's is the rest of the holdback."""
    c, _, _ = a_plane("strict")  # 12:00: eight hours to 20:00
    out = c.acquire(req("noon", P2))  # type: ignore[arg-type]
    assert out.retry_after_s == MAX_RETRY_AFTER_S and "in 28800 s" in out.reason
    base = ManualClock(0.0)
    day = datetime(2026, 3, 2, 19, 50, tzinfo=ZoneInfo(ZONE)).timestamp()
    c, plane = wired("strict", CompressedClock(base, origin_s=day, speed=60.0))
    out = c.acquire(req("evening", P2))  # type: ignore[arg-type]
    assert out.code is OutcomeCode.SHED and out.retry_after_s == 10.0  # 600 schedule s / 60
    assert "2026-03-02T20:00" in out.reason and "in 10 s" in out.reason
    assert plane.refusals["day-strict"] == 1 and not c.leases()


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


# ------------------------------------------------------------------ slice level: the spare KV budget
def a_kv_plane(**extra: object) -> tuple[LeaseController, TidalPlane, ManualClock]:
    clock = ManualClock(datetime(2026, 3, 2, 12, tzinfo=ZoneInfo(ZONE)).timestamp())
    c = LeaseController(
        [a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1")], clock=clock, store=MemoryLeaseStore()
    )
    for i in (0, 1):
        c.register_backend(
            Backend(f"be{i}", "m", "http://x", node="n0", gpu_id=f"g{i}", kv_budget_mib=10_000)
        )
    doc = {"timezone": ZONE, "initial_baseline": 60.0, "day_policy": "lending", "lending_min_samples": 5}
    cfg = plane_config({**doc, "lending_scope": "kv-budget", **extra})
    plane = TidalPlane(cfg, clock=clock, p2_usage=p2_usage_of(c.allocator))
    plane.kv_usage = kv_usage_of(c)
    c.admission_hook = plane
    return c, plane, clock


def kv_req(rid: str, prio: int, mib: int) -> object:
    return replace(a_request(rid, vram_mib=mib, priority=prio), model="m")


def raise_level(plane: TidalPlane, clock: ManualClock) -> None:
    """One clean window of P0 TTFTs, then a tick: the guard raises its level by one step."""
    clock.advance(plane.config.lending.window_s)
    for _ in range(10):
        plane.observe_ttft(0.2)
    plane.tick()


def test_kv_budget_lending_lends_the_spare_kv_of_idle_instances_at_the_guards_level() -> None:
    c, plane, clock = a_kv_plane()
    out = c.acquire(kv_req("x0", P2, 1000))  # type: ignore[arg-type]
    assert out.code is OutcomeCode.SHED and "DAY KV lending at level 0" in out.reason  # nothing lent yet
    raise_level(plane, clock)
    assert plane.guard.level == 0.25
    # two idle instances: spare = 2 x (50 % of 10,000 MiB) = 10,000 MiB; lent at 0.25: 2,500 MiB
    assert plane.kv_lending("m") == (2500, 10_000, 0)
    got = [c.acquire(kv_req(f"x{i}", P2, 1000)) for i in range(1, 4)]  # type: ignore[arg-type]
    assert [o.granted for o in got] == [True, True, False]
    assert "P2 holds 2000 MiB of the 2500 MiB lent from m's spare KV budget (10000 MiB" in got[2].reason
    assert plane.refusals["day-lending"] == 2
    before = sorted(x.id for x in c.request_leases())
    assert c.acquire(kv_req("x9", P2, 1000)).code is OutcomeCode.SHED  # type: ignore[arg-type]
    assert sorted(x.id for x in c.request_leases()) == before  # a refusal changes nothing
    view = plane.view()["lending"]
    assert isinstance(view, dict) and view["scope"] == "kv-budget"


def test_kv_budget_lending_busy_instances_lend_nothing_and_a_breach_backs_off_at_once() -> None:
    c, plane, clock = a_kv_plane(lending_kv_reserve=0.4)
    for _ in range(4):
        raise_level(plane, clock)
    assert plane.guard.level == 1.0
    assert plane.kv_lending("m") == (12_000, 12_000, 0)  # 2 x 60 % of 10,000
    assert c.acquire(kv_req("p2", P2, 3000)).granted  # type: ignore[arg-type]
    for i in range(2):  # online work fills both instances beyond what they may lend
        assert c.acquire(kv_req(f"p0-{i}", P0, 6500)).granted  # type: ignore[arg-type]
    lent, spare, held = plane.kv_lending("m")
    assert held == 3000 and lent == spare < 3000  # a busy instance lends nothing
    out = c.acquire(kv_req("more", P2, 100))  # type: ignore[arg-type]
    assert out.code is OutcomeCode.SHED and "does not fit" in out.reason
    for lease in list(c.request_leases()):
        if lease.priority >= 0:
            c.release(lease.id)
    assert c.acquire(kv_req("again", P2, 100)).granted  # type: ignore[arg-type]  # idle again: lent
    plane.observe_ttft(5.0)  # a breach: 10/11 < 0.99 in the window
    clock.advance(1)
    plane.tick()
    assert plane.guard.level == 0.0
    assert c.acquire(kv_req("after", P2, 100)).code is OutcomeCode.SHED  # type: ignore[arg-type]


def test_kv_budget_lending_off_switch_and_settings() -> None:
    c, _, _ = a_kv_plane(enabled=False)
    assert c.acquire(kv_req("p2", P2, 1000)).granted  # type: ignore[arg-type]  # off: never refuses
    with pytest.raises(InvalidInput, match=r"tidal\.lending_scope"):
        plane_config({"lending_scope": "gpus"})
    with pytest.raises(InvalidInput, match=r"tidal\.lending_kv_reserve"):
        plane_config({"lending_kv_reserve": 1})
