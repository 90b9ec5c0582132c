"""A wall-clock step moves the tidal schedule at once, and no lease's expiry with it.

`gpupool serve`'s wiring (`build` + `attach_serving`) on a real SQLite store, served on loopback,
with the host's clocks injected (`tests.builders.HostClocks`): the lease clock is `lease_clock`
over them and the schedule reads the wall function the bundle was built with. At 17:31 (UTC) after
half an hour of silence the pool stays in DAY (outside the night window); the wall clock is then
corrected by +3 h to 20:31 and the next tick enters NIGHT on the same measured silence, while a
lease of two hours granted at 17:00 keeps its expiry and stays active. Corrected back, the next
tick returns to DAY (the night window is over on the wall clock). Before, the schedule ran on the
lease clock and stayed at 17:31 until a restart.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx

from gpupool.cli.leaseclock import lease_clock
from gpupool.cli.serve import build
from gpupool.cli.tidalplane import attach_serving
from gpupool.core.tidal.plane import plane_config
from tests.adapters.http.servers import served
from tests.builders import HostClocks

TOKEN = "tidal-wall-admin"
HDR = {"Authorization": f"Bearer {TOKEN}"}
HOUR_S = 3600


def at(hh: int, mm: int = 0) -> float:
    return datetime(2026, 3, 2, hh, mm, tzinfo=ZoneInfo("UTC")).timestamp()


async def _steps(tmp: Path) -> None:
    host = HostClocks()
    host.wall_s = at(17)
    bundle = build(
        data_dir=tmp,
        extra_tokens=[(TOKEN, "ops", "admin")],
        simulate=False,
        clock=lease_clock(wall=host.wall, monotonic=host.monotonic),
        wall=host.wall,
    )
    cfg = plane_config({"timezone": "UTC", "initial_baseline": 10.0})
    rt = attach_serving(bundle, config=cfg, data_dir=tmp)
    try:
        async with served(bundle.app) as url, httpx.AsyncClient(base_url=url, headers=HDR, timeout=10) as cl:

            async def tidal() -> dict[str, object]:
                pool = (await cl.get("/v1/pool")).json()
                view: dict[str, object] = pool["tidal"]
                return view

            rt.step()  # 17:00, no demand: the low stretch begins
            r = await cl.post("/v1/leases", json={"priority": "P1", "vram_mib": 1024, "ttl_s": 2 * HOUR_S})
            assert r.status_code == 201, r.text
            lease = r.json()
            host.pass_time(31 * 60)
            rt.step()  # 17:31: silent for 31 min, but outside the night window
            view = await tidal()
            assert view["mode"] == "day" and str(view["local_time"]).startswith("2026-03-02T17:31"), view

            host.step_wall(+3 * HOUR_S)  # the wall clock is corrected: it is 20:31
            rt.step()
            view = await tidal()
            assert str(view["local_time"]).startswith("2026-03-02T20:31"), view
            assert view["mode"] == "night", view
            assert [t.reason for t in rt.plane.controller.transitions] == ["traffic-low"]
            # the lease clock did not follow the step: same expiry, still active after an acquisition
            # (which expires every due lease first)
            r = await cl.post("/v1/leases", json={"priority": "P1", "vram_mib": 1024, "ttl_s": 60})
            assert r.status_code == 201, r.text
            got = (await cl.get(f"/v1/leases/{lease['id']}")).json()
            assert got["state"] == "active" and got["expires_at"] == lease["expires_at"], got
            assert bundle.controller.clock.now() == at(17) + 31 * 60

            host.step_wall(-3 * HOUR_S)  # and back: 17:31 again, outside the night window
            rt.step()
            view = await tidal()
            assert view["mode"] == "day" and str(view["local_time"]).startswith("2026-03-02T17:31"), view
            assert [t.reason for t in rt.plane.controller.transitions] == ["traffic-low", "schedule"]
            got = (await cl.get(f"/v1/leases/{lease['id']}")).json()
            assert got["state"] == "active" and got["expires_at"] == lease["expires_at"], got
    finally:
        if rt.batch is not None:
            rt.batch.close()
        bundle.controller.store.close()


def test_the_tidal_schedule_follows_a_wall_step_while_leases_keep_their_expiry(tmp_path: Path) -> None:
    asyncio.run(_steps(tmp_path))
