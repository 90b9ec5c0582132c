"""The gateway's lease clock (`gpupool.cli.leaseclock`) keeps leases and tickets to their durations
whatever the wall clock does: a real `LeaseController` on a real SQLite store, its clock made by
`lease_clock` from injected wall and monotonic functions (`tests.builders.HostClocks`), so the wall
clock can step by hours without touching the host's. Across a restart the clock re-anchors to the
wall time, and stored expiry times are compared with it (documented in docs/store.md, "Time")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.leaseclock import lease_clock
from gpupool.core import P1, OutcomeCode
from gpupool.core.controller import LeaseController
from gpupool.core.leases import LeaseState
from tests.builders import START_WALL_S, HostClocks, a_request, a_slice

HOUR_S = 3600
TTL_S = 600


def controller(store: SqliteLeaseStore, host: HostClocks) -> LeaseController:
    c = LeaseController(
        [a_slice("c0", gpu="g0")],
        clock=lease_clock(wall=host.wall, monotonic=host.monotonic),
        store=store,
    )
    c.recover()
    return c


def state(c: LeaseController, store: SqliteLeaseStore, lease_id: str) -> LeaseState:
    c.tick()
    c.flush()
    stored = store.get(lease_id)
    assert stored is not None
    return stored.state


def test_the_clock_follows_the_monotonic_clock_not_the_wall_clock() -> None:
    host = HostClocks()
    clock = lease_clock(wall=host.wall, monotonic=host.monotonic)
    assert clock.now() == START_WALL_S  # anchored to the wall time: stored times are Unix seconds
    host.step_wall(+2 * HOUR_S)
    assert clock.now() == START_WALL_S
    host.step_wall(-5 * HOUR_S)
    assert clock.now() == START_WALL_S
    host.pass_time(30)
    assert clock.now() == START_WALL_S + 30


@pytest.mark.parametrize("step_s", [+2 * HOUR_S, -2 * HOUR_S])
def test_a_wall_step_neither_ends_nor_stretches_a_lease(tmp_path: Path, step_s: int) -> None:
    host = HostClocks()
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = controller(store, host)
    out = c.acquire(a_request("a", vram_gib=10, priority=P1, ttl_s=TTL_S))
    assert out.lease is not None
    lease_id = out.lease.id

    host.pass_time(100)
    host.step_wall(step_s)
    assert state(c, store, lease_id) is LeaseState.ACTIVE
    assert c.renew(lease_id).code is OutcomeCode.RENEWED  # renewed while the wall clock is off

    host.pass_time(TTL_S - 1)
    host.step_wall(-step_s)  # the wall clock is corrected back
    assert state(c, store, lease_id) is LeaseState.ACTIVE  # 1 s of its TTL is left

    host.pass_time(2)
    assert state(c, store, lease_id) is LeaseState.EXPIRED
    store.close()


def test_a_wall_step_keeps_a_queued_requests_deadline(tmp_path: Path) -> None:
    host = HostClocks()
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = controller(store, host)
    assert c.acquire(a_request("fill", vram_gib=70, priority=P1, ttl_s=10 * HOUR_S)).granted
    q = c.acquire(a_request("waits", vram_gib=70, priority=P1, tenant="u"), wait_s=60.0)
    assert q.code is OutcomeCode.QUEUED and q.ticket

    host.step_wall(+2 * HOUR_S)
    c.tick()
    assert c.ticket(q.ticket).state == "queued"
    host.pass_time(61)
    c.tick()
    assert c.ticket(q.ticket).state == "shed"
    store.close()


@pytest.mark.parametrize(("step_s", "expired"), [(0, 0), (+2 * HOUR_S, 1)])
def test_a_restart_compares_stored_expiry_with_the_new_wall_time(
    tmp_path: Path, step_s: int, expired: int
) -> None:
    host = HostClocks()
    store = SqliteLeaseStore(tmp_path / "leases.db")
    first = controller(store, host)
    out = first.acquire(a_request("a", vram_gib=10, priority=P1, ttl_s=TTL_S))
    assert out.lease is not None
    first.flush()
    store.close()

    host.pass_time(60)  # the gateway is down for a minute...
    host.step_wall(step_s)  # ...and the wall clock may step meanwhile
    store = SqliteLeaseStore(tmp_path / "leases.db")
    second = LeaseController(
        [a_slice("c0", gpu="g0")], clock=lease_clock(host.wall, host.monotonic), store=store
    )
    report = second.recover()
    assert (report.restored, report.expired) == (1 - expired, expired)
    store.close()
