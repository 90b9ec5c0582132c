"""A wall-clock step does not expire a lease through the gateway: `gpupool serve`'s builder on a real
SQLite store, served by a real server, its lease clock made by `lease_clock` from injected wall and
monotonic functions (`tests.builders.HostClocks`). The wall clock jumps two hours ahead and back
while a client renews over HTTP; the lease ends exactly when its TTL of monotonic time has passed
since the last renewal. Every check reads state after a call that expires due leases first
(acquire, renew), never after a wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gpupool.cli.leaseclock import lease_clock
from gpupool.cli.serve import build
from gpupool.core.clock import AnchoredClock
from tests.adapters.http.servers import running
from tests.builders import HostClocks

ADMIN, TENANT = "wc-admin-token-0001", "wc-tenant-token-001"
HOUR_S = 3600
TTL_S = 600


def auth_file(tmp_path: Path) -> Path:
    auth = tmp_path / "auth.yaml"
    auth.write_text(
        f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
        f"  - {{token: {TENANT}, tenant: a, role: tenant}}\n"
    )
    return auth


def acquire(url: str) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/v1/leases",
        headers={"Authorization": f"Bearer {TENANT}"},
        json={"priority": "P1", "vram_mib": 1024, "ttl_s": TTL_S},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def lease_state(url: str, lease_id: str) -> str:
    acquire(url)  # (an acquisition reclaims every due lease before it places)
    r = httpx.get(f"{url}/v1/leases/{lease_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return str(r.json()["state"])


def test_a_wall_step_does_not_expire_a_lease_through_the_gateway(tmp_path: Path) -> None:
    host = HostClocks()
    bundle = build(
        data_dir=tmp_path / "d",
        auth_file=auth_file(tmp_path),
        simulate=False,
        clock=lease_clock(wall=host.wall, monotonic=host.monotonic),
    )
    with running(bundle.app) as url:
        lease_id = acquire(url)["id"]
        host.pass_time(100)
        host.step_wall(+2 * HOUR_S)
        renew = httpx.post(
            f"{url}/v1/leases/{lease_id}/renew", headers={"Authorization": f"Bearer {TENANT}"}, timeout=10
        )
        assert renew.status_code == 200, renew.text
        host.step_wall(-2 * HOUR_S)  # corrected back
        host.pass_time(TTL_S - 1)
        assert lease_state(url, lease_id) == "active"
        host.step_wall(-2 * HOUR_S)  # and a step back changes nothing either
        host.pass_time(2)
        assert lease_state(url, lease_id) == "expired"


def test_serve_builds_its_controller_on_the_anchored_lease_clock(tmp_path: Path) -> None:
    bundle = build(data_dir=tmp_path / "d", auth_file=auth_file(tmp_path), simulate=False)
    assert isinstance(bundle.controller.clock, AnchoredClock)
