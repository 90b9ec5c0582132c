"""Property: whatever mix of grants, preemptions, releases, renewals and expiries meets whatever
pattern of refused store writes, the controller's books stay consistent and its active leases are
exactly the stored active ones (SQLite behind a fault-injecting wrapper)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core import P0, P1, P2, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids
from tests.adapters.store.faulty import FaultyStore
from tests.builders import a_request, a_slice

op = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from([P0, P1, P2]), st.sampled_from([10, 30, 50, 70])),
    st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("renew"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("tick"), st.integers(1, 40), st.just(0)),
    st.tuples(st.just("fault"), st.booleans(), st.just(0)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=25))
def test_memory_equals_store_under_any_refusals(ops: list[tuple[str, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        store = FaultyStore(SqliteLeaseStore(Path(d) / "leases.db"))
        clock = ManualClock(1000.0)
        slices = [a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1", vram_gib=40)]
        c = LeaseController(slices, clock=clock, store=store, lease_ids=seeded_lease_ids(5))
        c.recover()
        seen: list[str] = []
        try:
            for n, (kind, a, b) in enumerate(ops):
                try:
                    if kind == "acquire":
                        out = c.acquire(a_request(f"r{n}", vram_gib=b, priority=a, ttl_s=30), wait_s=20)
                        if out.lease is not None:
                            seen.append(out.lease.id)
                    elif kind in ("release", "renew") and seen:
                        lid = seen[a % len(seen)]
                        c.release(lid) if kind == "release" else c.renew(lid)
                    elif kind == "tick":
                        clock.advance(a)
                        c.tick()
                    elif kind == "fault":
                        store.disk_full() if a else store.heal()
                except sqlite3.OperationalError:
                    assert store.fail is not None
                c.check_invariants()
                assert store.inner.active() == c.leases()
        finally:
            store.close()
