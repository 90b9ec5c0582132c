"""Sessions (`core/sessions.py`) and the KV lane's preferred slice: the session id's sources, routing to
the instance holding most of a session's prefix, the red-line prediction, the LRU victim order and
the host tier that evicted prefixes move to."""

from __future__ import annotations

import itertools

import pytest

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import ManualClock
from gpupool.core.controller import KV_PREFIX, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Request
from gpupool.core.ports import Backend
from gpupool.core.sessions import SessionTable, session_of
from gpupool.hardware.units import Resources

MODEL = "qwen2.5-0.5b"
_ids = itertools.count()


def _table(**kw: int) -> tuple[SessionTable, ManualClock]:
    clock = ManualClock(100.0)
    return SessionTable(now=clock.now, **kw), clock


def _turn(t: SessionTable, clock: ManualClock, session: str, inst: str, mib: int, budget: int = 100) -> None:
    t.begin(session, inst, budget_mib=budget)
    clock.advance(1.0)
    t.end(session, inst, mib)
    t.check()


def test_session_id_header_then_user_then_prompt_cache_key() -> None:
    body = {"user": "u1", "prompt_cache_key": "k1"}
    assert session_of({"x-gpupool-session": "h1"}, body) == "h1"
    assert session_of({}, body) == "u1"
    assert session_of({}, {"prompt_cache_key": "k1"}) == "k1"
    assert session_of({}, {"user": "", "prompt_cache_key": "k1"}) == "k1"
    assert session_of({}, {"user": 7}) == ""
    assert session_of({}, {}) == ""


def test_routes_to_the_instance_holding_most_of_the_prefix() -> None:
    t, clock = _table()
    _turn(t, clock, "s", "a", 10)
    _turn(t, clock, "s", "b", 30)
    idle = {"a": (0, 100), "b": (0, 100)}
    assert t.prefer("s", 5, idle.__getitem__) == "b"
    assert t.prefer("unknown", 5, idle.__getitem__) == ""
    assert t.prefix_routed == 1


def test_red_line_counts_current_use_plus_the_request() -> None:
    t, _ = _table(red_line_pct=90)
    assert not t.over_red_line(80, 10, 100)  # 90 % exactly: at the line, not over
    assert t.over_red_line(80, 11, 100)
    assert t.over_red_line(0, 91, 100)


def test_a_prefix_over_its_red_line_is_not_preferred() -> None:
    t, clock = _table(red_line_pct=90)
    _turn(t, clock, "s", "a", 40)
    _turn(t, clock, "s", "b", 10)
    # a holds more, but 60 in use + 40 for this turn would take it to 100 % > 90 %
    load = {"a": (60, 100), "b": (0, 100)}
    assert t.prefer("s", 40, load.__getitem__) == "b"
    assert t.red_line_hits == 0  # another holder was below its line
    load = {"a": (60, 100), "b": (55, 100)}
    assert t.prefer("s", 40, load.__getitem__) == ""
    assert t.red_line_hits == 1


def test_idle_sessions_are_reclaimed_least_recently_used_first() -> None:
    t, clock = _table()
    for s in ("s1", "s2", "s3"):
        _turn(t, clock, s, "a", 10)
    assert t.reclaim_order("a") == ["s1", "s2", "s3"]
    _turn(t, clock, "s1", "a", 10)  # used again: last victim now
    assert t.reclaim_order("a") == ["s2", "s3", "s1"]
    t.begin("s2", "a", budget_mib=100)  # a running turn is pinned: not a victim
    assert t.reclaim_order("a") == ["s3", "s1"]
    t.check()


def test_gpu_overflow_moves_lru_prefixes_to_the_host_tier_then_drops_them() -> None:
    t, clock = _table(host_mib=50)
    for s in ("s1", "s2", "s3"):
        _turn(t, clock, s, "a", 40)  # budget 100: the third pushes the oldest out of the GPU
    r1 = t.residency("s1", "a")
    assert r1 is not None and (r1.gpu_mib, r1.host_mib) == (0, 40)
    assert t.usage("a") == (80, 40)
    _turn(t, clock, "s4", "a", 40)  # s2 moves to the host tier; s1 (older) is dropped from it
    r1, r2 = t.residency("s1", "a"), t.residency("s2", "a")
    assert r1 is not None and r2 is not None
    assert (r1.gpu_mib, r1.host_mib) == (0, 0) and (r2.gpu_mib, r2.host_mib) == (0, 40)
    assert t.reclaim_order("a") == ["s3", "s4"]
    # the host-tier copy still attracts the session's next turn (GPU holders first)
    _turn(t, clock, "s2", "b", 0)
    assert t.prefer("s2", 5, lambda _: (0, 100)) == "a"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(InvalidInput, match="red_line_pct"):
        SessionTable(now=lambda: 0.0, red_line_pct=0)
    with pytest.raises(InvalidInput, match="host_mib"):
        SessionTable(now=lambda: 0.0, host_mib=-1)


def _req(mib: int) -> Request:
    return Request(
        id=f"r{next(_ids)}", tenant="t", priority=1, demand=Resources(mib, 0), ttl_s=60.0, model=MODEL
    )


def test_the_lane_takes_the_preferred_slice_when_it_has_room() -> None:
    c = LeaseController(seed_example_pool(), clock=ManualClock(1000.0), store=MemoryLeaseStore())
    for i in range(2):
        c.register_backend(Backend(f"be{i}", MODEL, "http://127.0.0.1:9", "gpu-b", "gpu-b/0", 1000))
    be0, be1 = KV_PREFIX + "be0", KV_PREFIX + "be1"
    first = c.acquire(_req(100)).lease
    assert first is not None and first.grants[0].slice_id == be0  # most free: the first of equals
    # be1 is now the most free; a preference for be0 wins while be0 has room
    again = c.acquire(_req(100), prefer=be0).lease
    assert again is not None and again.grants[0].slice_id == be0
    plain = c.acquire(_req(100)).lease
    assert plain is not None and plain.grants[0].slice_id == be1
    assert c.lane.load(be0) == (200, 1000)
    # no room on the preferred slice: the most free one instead
    big = c.acquire(_req(850), prefer=be0).lease
    assert big is not None and big.grants[0].slice_id == be1
    c.check_invariants()
