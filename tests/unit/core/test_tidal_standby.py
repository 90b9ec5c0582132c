"""`StandbySleeper`: the NIGHT sleep of standby instances and their wake-up, on a manual clock.

Checked: NIGHT takes a standby out of routing at once and gives the sleep directive only once it is
drained; the last awake instance of a model is never slept; a P0 burst wakes it at once and the
``sleep`` path runs from the burst's first arrival to the agent's confirmed wake; it sleeps again only
after the quiet time; the wake before DAY is planned back from the measured wake time; the settings
are read from the flat ``tidal:`` mapping and bad ones are named; the plane feeds NIGHT P0 arrivals
and answers when the wake is due.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from gpupool.core import P0, ManualClock
from gpupool.core.errors import InvalidInput, UnknownId
from gpupool.core.tidal.modes import Mode, TidalConfig
from gpupool.core.tidal.plane import PlaneConfig, TidalPlane, plane_config
from gpupool.core.tidal.standby import ASLEEP, AWAKE, Instance, StandbyConfig, StandbySleeper
from tests.builders import a_request

MAIN = "qwen2.5-14b"


def sleeper(**cfg: object) -> StandbySleeper:
    inst = {
        "main-0": Instance("main-0", MAIN, "http://127.0.0.1:1", "n1", "n1/0"),
        "main-1": Instance("main-1", MAIN, "http://127.0.0.1:2", "n1", "n1/1"),
        "embed-0": Instance("embed-0", "bge-m3", "http://127.0.0.1:3", "n2", "n2/0"),
    }
    return StandbySleeper(StandbyConfig(**cfg), inst)  # type: ignore[arg-type]


def idle(_bid: str) -> bool:
    return False


def test_night_stops_routing_at_once_and_sleeps_once_drained() -> None:
    s = sleeper(backends=("main-1",))
    assert s.step(0.0, night=False, wake_due=False, busy=idle) == []
    assert s.directives("n1")[0]["state"] == AWAKE and s.routable("main-1")
    busy = {"main-1"}
    changed = s.step(10.0, night=True, wake_due=False, busy=lambda b: b in busy)
    assert changed == ["main-1"] and not s.routable("main-1")
    assert s.state("main-1") == (ASLEEP, AWAKE, AWAKE)  # wanted asleep, still draining
    busy.clear()
    s.step(11.0, night=True, wake_due=False, busy=lambda b: b in busy)
    d = s.directives("n1")
    assert d == [
        {
            "id": "main-1",
            "gpu_id": "n1/1",
            "endpoint": "http://127.0.0.1:2",
            "pauser": "vllm-sleep",
            "level": 1,
            "state": ASLEEP,
        }
    ]
    assert s.directives("n2") == []
    s.report("main-1", ASLEEP, latency_ms=420.0, now=12.0)
    assert s.state("main-1") == (ASLEEP, ASLEEP, ASLEEP) and not s.routable("main-1")
    assert [w for _, w in s.log][-1].startswith("asleep")


def test_the_last_awake_instance_of_a_model_is_never_slept() -> None:
    s = sleeper(backends=("main-0", "main-1", "embed-0"))
    s.step(0.0, night=True, wake_due=False, busy=idle)
    states = {b: s.state(b)[0] for b in ("main-0", "main-1", "embed-0")}
    assert states == {"main-0": ASLEEP, "main-1": AWAKE, "embed-0": AWAKE}
    assert s.routable("main-1") and s.routable("embed-0")


def test_a_p0_burst_wakes_at_once_and_the_sleep_path_is_timed_to_the_confirmed_wake() -> None:
    s = sleeper(backends=("main-1",), wake_burst=3, burst_window_s=10.0, sleep_after_s=60.0)
    s.step(0.0, night=True, wake_due=False, busy=idle)
    s.report("main-1", ASLEEP, latency_ms=400.0, now=1.0)
    s.p0(MAIN, 100.0)
    s.p0(MAIN, 115.0)  # the first fell out of the window: no burst yet
    s.p0("bge-m3", 116.0)  # another model's arrivals do not count
    assert s.state("main-1")[0] == ASLEEP
    s.p0(MAIN, 117.0)
    assert s.state("main-1")[0] == ASLEEP
    s.p0(MAIN, 118.0)  # 3 within 10 s (115, 117, 118)
    assert s.state("main-1")[:2] == (AWAKE, AWAKE)
    assert not s.routable("main-1")  # not before the agent confirms it
    assert s.step(118.5, night=True, wake_due=False, busy=idle) == []
    s.report("main-1", AWAKE, latency_ms=436.0, now=119.5)
    assert s.paths == [pytest.approx(4500.0)]  # from the burst's first arrival (115 s)
    assert s.step(119.6, night=True, wake_due=False, busy=idle) == ["main-1"]
    assert s.routable("main-1")
    s.step(170.0, night=True, wake_due=False, busy=idle)  # within the quiet time: stays awake
    assert s.state("main-1")[0] == AWAKE
    s.step(178.0, night=True, wake_due=False, busy=idle)  # 60 s after the last burst arrival
    assert s.state("main-1")[0] == ASLEEP


def test_wake_before_day_is_planned_back_from_the_measured_wake_time() -> None:
    s = sleeper(backends=("main-1",), wake_lead_min_s=30.0)
    assert s.wake_lead_s() == 30.0
    s.step(0.0, night=True, wake_due=False, busy=idle)
    s.report("main-1", ASLEEP, latency_ms=100.0, now=1.0)
    s.step(2.0, night=True, wake_due=True, busy=idle)
    assert s.state("main-1")[:2] == (AWAKE, AWAKE)
    assert "wake lead" in s.log[-1][1]
    s.report("main-1", AWAKE, latency_ms=40_000.0, now=42.0)  # a slow wake: 40 s
    assert s.wake_lead_s() == 80.0  # twice the longest measured wake


def test_settings_name_the_bad_key_and_reports_are_checked() -> None:
    cfg = plane_config({"standby_backends": ["main-1"], "standby_wake_burst": 2, "standby_sleep_after_s": 5})
    assert cfg.standby == StandbyConfig(backends=("main-1",), wake_burst=2, sleep_after_s=5)
    for key, value in (
        ("standby_sleep_level", 3),
        ("standby_wake_burst", 0),
        ("standby_burst_window_s", -1),
        ("standby_backends", "main-1"),
        ("standby_backends", ["a", "a"]),
    ):
        with pytest.raises(InvalidInput) as exc:
            plane_config({key: value})
        assert exc.value.field == f"tidal.{key}", (key, exc.value.field)
    with pytest.raises(InvalidInput, match="not a registered backend"):
        sleeper(backends=("nope",))
    s = sleeper(backends=("main-1",))
    with pytest.raises(UnknownId):
        s.report("main-0", ASLEEP, latency_ms=1.0, now=0.0)
    with pytest.raises(InvalidInput):
        s.report("main-1", "dozing", latency_ms=1.0, now=0.0)


def test_the_plane_feeds_night_p0_arrivals_and_answers_when_the_wake_is_due() -> None:
    zone = ZoneInfo("UTC")
    clock = ManualClock(datetime(2026, 3, 2, 23, 0, tzinfo=zone).timestamp())
    cfg = PlaneConfig(tidal=TidalConfig(timezone="UTC", initial_baseline=60.0))
    plane = TidalPlane(cfg, clock=clock, p2_usage=lambda: (0, 1))
    s = sleeper(backends=("main-1",), wake_burst=2, wake_lead_min_s=600.0)
    plane.standby = s
    assert plane.standby_wake_due()  # DAY: always awake
    for _ in range(60):  # quiet after 20:00: the 30-minute low stretch switches to NIGHT
        clock.advance(60.0)
        plane.tick()
    assert plane.mode is Mode.NIGHT and not plane.standby_wake_due()
    s.step(clock.now(), night=True, wake_due=False, busy=idle)
    assert s.state("main-1")[0] == ASLEEP
    r = replace(a_request("p0", vram_gib=1, priority=P0), model=MAIN)
    plane.before_admit(r, kv=True)
    plane.before_admit(r, kv=True)
    assert s.state("main-1")[0] == AWAKE
    clock.set(datetime(2026, 3, 3, 8, 21, tzinfo=zone).timestamp())  # 9 min before 08:30
    assert plane.standby_wake_due()


def test_the_slice_is_lent_only_once_asleep_and_taken_back_before_the_wake_directive() -> None:
    s = sleeper(backends=("main-1",), wake_burst=1)
    s.step(0.0, night=True, wake_due=False, busy=idle)
    assert not s.lendable("main-1")  # the directive is out, the agent has not confirmed yet
    s.report("main-1", ASLEEP, latency_ms=100.0, now=1.0)
    assert s.lendable("main-1") and not s.wants_slice("main-1")
    s.set_held("main-1", False)  # the caller gave the placement lease back
    assert not s.lendable("main-1") and s.view()["main-1"]["slice_held"] is False  # type: ignore[index]
    s.p0(MAIN, 2.0)  # a burst of one: wanted awake at once
    assert s.state("main-1")[:2] == (AWAKE, AWAKE)
    assert s.wants_slice("main-1")
    assert s.directives("n1")[0]["state"] == ASLEEP  # not woken onto memory P2 may still hold
    s.set_held("main-1", True)
    assert s.directives("n1")[0]["state"] == AWAKE and not s.wants_slice("main-1")
    assert [w for _, w in s.log if w.startswith("slice")] == [
        "slice lent to P2 work",
        "slice taken back for the wake",
    ]
