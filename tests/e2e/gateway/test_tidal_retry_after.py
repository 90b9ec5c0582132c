"""The Retry-After of the DAY reservation's and day lending's refusals, over real HTTP.

The gateway (`gpupool serve`'s `build` + `attach_tidal`) serves on loopback; the tidal schedule runs
on a manual clock. A refusal that only NIGHT (or the lending guard's calm period) can lift says the
seconds until then (at most an hour); one that any release or the next request can lift keeps a
short Retry-After.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from gpupool.cli.serve import build
from gpupool.cli.tidalplane import attach_tidal
from gpupool.core import ManualClock
from gpupool.core.ports import Backend
from gpupool.core.tidal.plane import MAX_RETRY_AFTER_S, plane_config
from tests.adapters.http.servers import running

pytestmark = pytest.mark.slow
TOKEN = "tidal-retry-admin"
HDR = {"Authorization": f"Bearer {TOKEN}"}
GIB = 1024
MODEL = "qwen2.5-0.5b"


def at(hh: int, mm: int = 0, day: int = 2) -> float:
    return datetime(2026, 3, day, hh, mm, tzinfo=ZoneInfo("UTC")).timestamp()


def test_a_day_reservation_refusal_waits_for_night_only_when_only_night_can_lift_it(tmp_path: Path) -> None:
    """A P2 placement lease larger than the whole DAY share can only be granted at NIGHT: its 429
    says the seconds until the night window (at most an hour). One that fits the share but not next
    to the P2 leases already held can pass at any release: a short Retry-After. Before: 1 for both."""
    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    clock = ManualClock(at(19, 50))
    rt = attach_tidal(
        bundle, config=plane_config({"timezone": "UTC"}), data_dir=tmp_path, clock=clock, batch=False
    )
    held, cap = rt.plane.p2_usage()
    share_mib = rt.plane.p2_share_mib(cap)
    assert held == 0 and 60 * GIB < share_mib < 2 * 48 * GIB  # the default pool: about 81 GiB
    too_big = {"priority": "P2", "vram_mib": 48 * GIB, "gpu_count": 2}
    with running(bundle.app) as url, httpx.Client(base_url=url, headers=HDR, timeout=10) as cl:
        r = cl.post("/v1/leases", json=too_big)
        assert r.status_code == 429 and "DAY reservation" in r.text, r.text
        assert r.headers["retry-after"] == "600" and r.json()["retry_after_s"] == 600, r.text
        assert "in 600 s" in r.json()["error"], r.text
        clock.advance(at(12, day=3) - clock.now())  # noon: eight hours to the night window
        r = cl.post("/v1/leases", json=too_big)
        assert r.status_code == 429 and r.headers["retry-after"] == str(MAX_RETRY_AFTER_S), r.text
        r = cl.post("/v1/leases", json={"priority": "P2", "vram_mib": 60 * GIB, "ttl_s": 600})
        assert r.status_code == 201, r.text
        r = cl.post("/v1/leases", json={"priority": "P2", "vram_mib": 30 * GIB})
        assert r.status_code == 429 and "DAY reservation" in r.text, r.text
        assert r.headers["retry-after"] == "1", r.text  # the 60 GiB lease may be released any moment
    assert rt.plane.refusals["day-reservation"] == 3


@pytest.mark.parametrize("scope", ["requests", "kv-budget"])
def test_a_day_lending_refusal_waits_out_the_guards_calm_period(tmp_path: Path, scope: str) -> None:
    """Once the lending guard has backed off to level 0 it lends nothing until its calm window has
    passed (or NIGHT begins, whichever is first): a refused P2 request's Retry-After says so. While
    it may raise at any tick (no calm period) a short one. Before: 1 all day."""
    bundle = build(data_dir=tmp_path, extra_tokens=[(TOKEN, "ops", "admin")])
    be = Backend("be", MODEL, "http://127.0.0.1:9", node="gpu-a", gpu_id="gpu-a/0", kv_budget_mib=4096)
    bundle.controller.register_backend(be)
    clock = ManualClock(at(12))
    cfg = plane_config(
        {
            "timezone": "UTC",
            "day_policy": "lending",
            "lending_scope": scope,
            "lending_min_samples": 5,
            "lending_window_s": 300,
        }
    )
    rt = attach_tidal(bundle, config=cfg, data_dir=tmp_path, clock=clock, batch=False)
    plane = rt.plane
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    p2 = {**HDR, "x-gpupool-priority": "P2"}
    with running(bundle.app) as url, httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and "lending at level 0" in r.text, r.text
        assert r.headers["retry-after"] == "1", r.text  # no calm period: a raise may come at any tick
        for _ in range(5):
            plane.observe_ttft(0.1)
        rt.step()
        assert plane.guard.level == 0.25
        clock.advance(10)
        for _ in range(5):
            plane.observe_ttft(5.0)  # P0 misses its TTFT target: the guard backs off
        rt.step()
        assert plane.guard.level == 0.0
        clock.advance(60)
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and "lending at level 0" in r.text, r.text
        assert r.headers["retry-after"] == "240", r.text  # the rest of the 300 s calm window
        assert "in 240 s" in r.json()["error"]["message"], r.text
        clock.advance(at(19, 57) - clock.now())  # a later back-off three minutes before 20:00
        for _ in range(5):
            plane.observe_ttft(0.1)
        rt.step()
        for _ in range(30):
            plane.observe_ttft(5.0)
        rt.step()
        assert plane.guard.level == 0.0, plane.guard.changes
        r = cl.post("/v1/chat/completions", json=chat, headers=p2)
        assert r.status_code == 429 and r.headers["retry-after"] == "180", r.text  # NIGHT comes first
    assert bundle.controller.request_lease_count() == 0
