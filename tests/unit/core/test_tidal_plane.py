"""`TidalPlane` wired into a real `LeaseController` (memory store): measured demand drives the mode,
the DAY reservation refuses P2 placement leases beyond the P2 share with a reason (state unchanged),
NIGHT lends more and a P0 arrival at night arms the holdback; the schedule's next boundary and the
restore deadline follow the time zone."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import yaml

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.core import P0, P1, P2, ManualClock, OutcomeCode
from gpupool.core.controller import LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.poolview import pool_view
from gpupool.core.tidal.modes import Mode, TidalConfig
from gpupool.core.tidal.plane import PlaneConfig, TidalPlane, p2_usage_of, plane_config
from tests.builders import a_request, a_slice

ZONE = "Europe/Berlin"


def at(hh: int, mm: int = 0, day: int = 2) -> float:
    return datetime(2026, 3, day, hh, mm, tzinfo=ZoneInfo(ZONE)).timestamp()


def a_plane(
    start_s: float, *, enabled: bool = True, **tidal: object
) -> tuple[LeaseController, TidalPlane, ManualClock]:
    clock = ManualClock(start_s)
    c = LeaseController(
        [a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1")],  # 2 x 80 GiB = 160 GiB
        clock=clock,
        store=MemoryLeaseStore(),
        lease_ids=seeded_lease_ids(3),
    )
    cfg = TidalConfig(timezone=ZONE, initial_baseline=60.0, **tidal)  # type: ignore[arg-type]
    plane = TidalPlane(
        PlaneConfig(tidal=cfg, enabled=enabled, holdback_s=30.0),
        clock=clock,
        p2_usage=p2_usage_of(c.allocator),
    )
    c.admission_hook = plane
    c.views["tidal"] = plane.view
    return c, plane, clock


def test_day_reservation_refuses_p2_beyond_its_share_with_a_reason_and_changes_nothing() -> None:
    c, plane, _ = a_plane(at(12))
    assert plane.mode is Mode.DAY
    assert c.acquire(a_request("a", vram_gib=16, priority=P2)).granted
    assert c.acquire(a_request("b", vram_gib=16, priority=P2)).granted  # 32 GiB = 20 % of 160 GiB
    before = [x.id for x in c.leases()]
    out = c.acquire(a_request("c", vram_gib=1, priority=P2))
    assert out.code is OutcomeCode.SHED
    assert "DAY reservation" in out.reason and "32768 MiB" in out.reason
    assert [x.id for x in c.leases()] == before
    assert plane.refusals["day-reservation"] == 1
    # online work is not limited by the P2 share
    assert c.acquire(a_request("p0", vram_gib=60, priority=P0)).granted
    assert c.acquire(a_request("p1", vram_gib=40, priority=P1)).granted
    c.check_invariants()


def test_the_off_switch_counts_demand_but_never_refuses() -> None:
    c, plane, _ = a_plane(at(12), enabled=False)
    for i in range(4):
        assert c.acquire(a_request(f"b{i}", vram_gib=30, priority=P2)).granted
    assert plane.refusals == {}
    c.acquire(a_request("p0", vram_gib=1, priority=P0))
    assert plane.meter.total == 1


def test_demand_counts_p0_and_p1_arrivals_per_model_not_p2() -> None:
    c, plane, clock = a_plane(at(12))
    for i in range(3):
        c.acquire(replace(a_request(f"x{i}", priority=P0), model="qwen"))
    c.acquire(a_request("y", priority=P1))
    c.acquire(a_request("z", priority=P2))
    assert plane.meter.per_model_per_minute(clock.now()) == {"lease-api": 1.0, "qwen": 3.0}
    assert plane.meter.per_minute(clock.now()) == 4.0
    clock.advance(61)
    assert plane.meter.per_minute(clock.now()) == 0.0
    view = pool_view(c)["tidal"]
    assert isinstance(view, dict) and view["mode"] == "day"


def night(c: LeaseController, plane: TidalPlane, clock: ManualClock) -> None:
    """Quiet traffic from 20:00 until the 30-minute low stretch switches to NIGHT."""
    for _ in range(60):
        clock.advance(60)
        plane.tick()
        if plane.mode is Mode.NIGHT:
            return
    raise AssertionError("no NIGHT after an hour of silence in the night window")


def test_quiet_night_switches_on_measured_demand_and_lends_more() -> None:
    c, plane, clock = a_plane(at(19, 59))
    # busy evening: 120 arrivals/min keeps DAY even inside the night window
    for _ in range(40):
        for i in range(120):
            c.acquire(replace(a_request(f"r{clock.now()}-{i}", priority=P0, ttl_s=5), model="m"))
        clock.advance(30)
        plane.tick()
        clock.advance(30)
        c.tick()
    assert plane.mode is Mode.DAY
    night(c, plane, clock)
    tr = plane.controller.transitions[-1]
    assert tr.reason == "traffic-low"
    assert plane.p2_share() == pytest.approx(0.75)
    assert c.acquire(a_request("big1", vram_gib=60, priority=P2, ttl_s=3600)).granted
    assert c.acquire(a_request("big2", vram_gib=60, priority=P2, ttl_s=3600)).granted  # 120 = 75 %
    out = c.acquire(a_request("more", vram_gib=1, priority=P2, ttl_s=3600))
    assert out.code is OutcomeCode.SHED and "NIGHT reservation" in out.reason
    assert plane.next_switch()["to"] == "day"


def test_a_p0_arrival_at_night_arms_the_holdback_and_is_classified() -> None:
    c, plane, clock = a_plane(at(20))
    night(c, plane, clock)
    assert c.acquire(a_request("fill", vram_gib=80, priority=P2, ttl_s=3600)).granted
    out = c.acquire(a_request("p0", vram_gib=40, priority=P0))
    assert out.granted and not out.victims
    assert plane.paths["free"].count == 1
    refused = c.acquire(a_request("late", vram_gib=1, priority=P2))
    assert refused.code is OutcomeCode.SHED and "holdback" in refused.reason
    assert refused.retry_after_s == 30.0  # the rest of the holdback, not 1 s
    # P0 that must displace P2 work: the preempt path
    out2 = c.acquire(a_request("p0b", vram_gib=80, priority=P0))
    assert out2.granted and out2.victims
    assert plane.paths["preempt"].count == 1
    clock.advance(31)
    assert c.acquire(a_request("after", vram_gib=1, priority=P2)).granted


def test_next_switch_and_restore_deadline_follow_the_time_zone() -> None:
    _, plane, _ = a_plane(at(12), night_end="08:45", day_start="08:45")
    nxt = plane.next_switch()
    assert nxt["to"] == "night" and str(nxt["earliest_local"]).startswith("2026-03-02T20:00")
    assert plane.restore_due()  # DAY: the day layout must be in place
    c2, plane2, clock2 = a_plane(at(20), night_end="08:45", day_start="08:45")
    night(c2, plane2, clock2)
    assert not plane2.restore_due()
    assert str(plane2.next_switch()["restore_by_local"]).startswith("2026-03-03T08:35")  # 08:45 - 10 min
    clock2.advance(at(8, 36, day=3) - clock2.now())
    plane2.tick()
    assert plane2.mode is Mode.NIGHT and plane2.restore_due()


def test_settings_name_the_bad_key() -> None:
    with pytest.raises(InvalidInput, match=r"tidal\.nope"):
        plane_config({"nope": 1})
    with pytest.raises(InvalidInput, match=r"tidal\.timezone"):
        plane_config({"timezone": "Mars/Olympus"})
    with pytest.raises(InvalidInput, match=r"tidal\.holdback_s"):
        plane_config({"holdback_s": -1})
    cfg = plane_config({"timezone": "UTC", "day_reserved_fraction": 0.5, "repartition_gpus": ["gpu-a/1"]})
    assert cfg.tidal.timezone == "UTC" and cfg.repartition_gpus == ("gpu-a/1",)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enter_hold_s", 10**400),  # YAML integers have no bound; no float holds this one
        ("holdback_s", -(10**400)),
        ("min_day_dwell_s", 10**400),
        ("initial_baseline", 10**400),
        ("lending_window_s", 10**400),
        ("standby_sleep_after_s", 10**400),
        ("timezone", "a" * 5000),  # longer than a file name: the zone lookup fails with OSError
        ("timezone", 5),
        ("timezone", None),
        ("enter_ratio", "0.1"),
        ("exit_ratio", None),
        ("min_day_dwell_s", "30m"),
    ],
    ids=lambda v: repr(v)[:20],
)
def test_a_bad_value_of_any_type_names_its_setting(key: str, value: object) -> None:
    with pytest.raises(InvalidInput) as e:
        plane_config({key: value})
    assert e.value.field == f"tidal.{key}", str(e.value)


def test_an_unquoted_yaml_time_is_refused_with_the_time_as_written() -> None:
    # YAML 1.1 reads an unquoted 19:30 as the base-60 number 1170: say so, not just "1170"
    doc = yaml.safe_load("tidal:\n  day_end: 19:30\n")["tidal"]
    with pytest.raises(InvalidInput) as e:
        plane_config(doc)
    assert e.value.field == "tidal.day_end" and "in quotes" in e.value.reason, str(e.value)
    assert "unquoted 19:30 as the number 1170" in e.value.reason, str(e.value)


def test_back_in_day_p2_above_its_share_is_reclaimed_newest_first() -> None:
    c, plane, clock = a_plane(at(20))
    night(c, plane, clock)
    ids = []
    for i in range(4):
        out = c.acquire(a_request(f"n{i}", vram_gib=25, priority=P2, ttl_s=36000))
        assert out.granted and out.lease is not None
        ids.append(out.lease.id)
        clock.advance(1)
    assert plane.reclaim(c.allocator.leases) == []  # NIGHT: 100 GiB is within 75 %
    clock.advance(at(7, 0, day=3) - clock.now())
    plane.tick()
    assert plane.mode is Mode.DAY
    # 100 GiB held, share 32 GiB: the three newest go, the oldest stays
    assert plane.reclaim(c.allocator.leases) == ids[:0:-1]
