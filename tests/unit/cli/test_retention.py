"""The running gateway deletes ended leases and tickets from its store once they are past the
retention (before, nothing did while it ran: a SQLite store grew with every lease ever taken); an
active lease and a recently ended one stay. Real SQLite store, the loop `serve_forever` starts."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.retention import purge_loop
from gpupool.core.clock import ManualClock
from gpupool.core.controller import ControllerConfig, LeaseController
from gpupool.core.model import Request
from gpupool.hardware.units import Resources


def _req(i: int) -> Request:
    return Request(id=f"r{i}", tenant="t", priority=50, demand=Resources(1024, 0), ttl_s=3600.0)


def _rows(db: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return {r[0] for r in con.execute("SELECT id FROM leases")}


def test_ended_leases_past_the_retention_leave_the_store_while_it_runs(tmp_path: Path) -> None:
    db = tmp_path / "leases.db"
    store = SqliteLeaseStore(db)
    clock = ManualClock(1000.0)
    c = LeaseController(
        seed_example_pool(), clock=clock, store=store, config=ControllerConfig(ended_retention_s=60.0)
    )
    try:
        old = [c.acquire(_req(i)).lease for i in range(3)]
        kept = c.acquire(_req(9)).lease
        assert all(old) and kept is not None
        for x in old:
            c.release(x.id)  # type: ignore[union-attr]
        c.flush()
        clock.advance(61.0)
        recent = c.acquire(_req(10)).lease
        assert recent is not None
        c.release(recent.id)
        c.flush()
        assert _rows(db) == {x.id for x in old} | {kept.id, recent.id}  # type: ignore[union-attr]

        async def one_pass() -> None:
            task = asyncio.create_task(purge_loop(c, period_s=3600.0, first_s=0.0))
            while _rows(db) != {kept.id, recent.id}:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run(asyncio.wait_for(one_pass(), 30))
        assert c.get(kept.id).state.value == "active"
    finally:
        store.close()
