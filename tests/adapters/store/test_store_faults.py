"""A store that refuses writes (full disk) leaves the controller's memory equal to the store: the
refused change is undone in the ledger and lease table, its events are never delivered, and the
store's own error reaches the caller. Checked with `check_invariants` and against a fresh recovery
of a second controller from the same SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core import P0, P1, P2, LeaseState, ManualClock, OutcomeCode
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids
from gpupool.core.ports import GatewayEvent, LeaseStore
from gpupool.hardware.slices import Slice
from tests.adapters.store.faulty import DISK_FULL, FaultyStore
from tests.builders import a_request, a_slice


def pool() -> list[Slice]:
    return [a_slice("g0", gpu="g0"), a_slice("g1", gpu="g1", vram_gib=40)]


def controller(store: LeaseStore, clock: ManualClock, seed: int = 3) -> tuple[LeaseController, list[str]]:
    kinds: list[str] = []

    def sink(e: GatewayEvent) -> None:
        kinds.append(e.kind)

    c = LeaseController(pool(), clock=clock, store=store, sink=sink, lease_ids=seeded_lease_ids(seed))
    c.recover()
    return c, kinds


def books(c: LeaseController) -> list[tuple[str, int, int, int]]:
    return [
        (st.slice.id, st.granted.vram_mib, st.granted.compute_milli, st.num_leases)
        for st in c.allocator.states()
    ]


def assert_memory_equals_store(
    c: LeaseController, path: Path, clock: ManualClock, *, restart: bool = True
) -> None:
    """The controller's books are self-consistent, its active leases are exactly the stored ones,
    and (``restart``) a controller recovering from the file now rebuilds the same books."""
    c.check_invariants()
    store = SqliteLeaseStore(path)
    try:
        assert store.active() == c.leases()
        if restart:
            fresh, _ = controller(store, clock, seed=99)
            assert fresh.leases() == c.leases()
            assert books(fresh) == books(c)
    finally:
        store.close()


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    clock = ManualClock(1000.0)
    store = FaultyStore(SqliteLeaseStore(tmp_path / "leases.db"))
    c, kinds = controller(store, clock)
    yield c, store, kinds, clock, tmp_path / "leases.db"
    store.close()


def test_refused_grant_is_undone_and_not_evented(setup) -> None:  # type: ignore[no-untyped-def]
    c, store, kinds, clock, path = setup
    first = c.acquire(a_request("r1", vram_gib=70, priority=P1)).lease
    assert first is not None
    before = books(c)
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.acquire(a_request("r2", vram_gib=30, priority=P1))
    assert c.leases() == [first] and books(c) == before
    assert kinds == ["granted"]  # the refused grant's event was dropped
    assert_memory_equals_store(c, path, clock)
    store.heal()
    again = c.acquire(a_request("r2", vram_gib=30, priority=P1))
    assert again.code is OutcomeCode.GRANTED  # the refused grant's capacity was given back
    assert_memory_equals_store(c, path, clock)


def test_refused_release_and_renew_leave_the_lease_as_stored(setup) -> None:  # type: ignore[no-untyped-def]
    c, store, kinds, clock, path = setup
    lease = c.acquire(a_request("r1", vram_gib=10, priority=P1, ttl_s=60)).lease
    assert lease is not None
    clock.advance(5)
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.release(lease.id)
    assert c.get(lease.id) == lease and c.get(lease.id).state is LeaseState.ACTIVE
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.renew(lease.id, ttl_s=600)
    assert c.get(lease.id).expires_at == lease.expires_at
    assert_memory_equals_store(c, path, clock)
    store.heal()
    out = c.release(lease.id)
    assert out.code is OutcomeCode.RELEASED  # not "already released": the refused release never happened
    assert kinds == ["granted", "released"]
    assert_memory_equals_store(c, path, clock)


def test_refused_preemption_puts_the_victims_back(setup) -> None:  # type: ignore[no-untyped-def]
    c, store, _, clock, path = setup
    victims = [c.acquire(a_request(f"v{gib}", vram_gib=gib, priority=P2)).lease for gib in (60, 30)]
    assert all(v is not None for v in victims)
    before = books(c)
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.acquire(a_request("p0", vram_gib=70, priority=P0))
    assert c.leases() == sorted(victims, key=lambda x: x.id) and books(c) == before  # type: ignore[union-attr]
    assert_memory_equals_store(c, path, clock)


def test_refused_expiry_is_retried_once_the_store_heals(setup) -> None:  # type: ignore[no-untyped-def]
    c, store, kinds, clock, path = setup
    lease = c.acquire(a_request("r1", vram_gib=10, priority=P1, ttl_s=10)).lease
    assert lease is not None
    clock.advance(20)
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.tick()
    assert c.get(lease.id).state is LeaseState.ACTIVE  # as the store still has it
    assert_memory_equals_store(c, path, clock, restart=False)  # a restart now would expire it
    store.heal()
    c.tick()
    assert c.get(lease.id).state is LeaseState.EXPIRED and kinds == ["granted", "expired"]


def test_a_really_full_sqlite_file_names_its_error_and_undoes_the_batch(tmp_path: Path) -> None:
    """No wrapper: SQLite itself runs out of pages (``max_page_count``) in the middle of a batch and
    rolls the transaction back on its own; the caller must see SQLite's error, not a failed ROLLBACK,
    and none of the batch's leases may stay granted in memory."""
    clock = ManualClock(1000.0)
    path = tmp_path / "leases.db"
    store = SqliteLeaseStore(path)
    c, kinds = controller(store, clock)
    c.autoflush = False
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]  # fault injection: no more pages
    store._db.execute(f"PRAGMA max_page_count={pages}")
    for i in range(100):
        assert c.acquire(a_request(f"r{i}", vram_mib=100, priority=P1)).granted
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.flush()
    assert c.leases() == [] and not c.dirty and kinds == []
    assert_memory_equals_store(c, path, clock)
    store._db.execute("PRAGMA max_page_count=1073741823")  # space is back
    assert c.acquire(a_request("after", vram_mib=100, priority=P1)).granted
    c.flush()
    assert len(c.leases()) == 1 and kinds == ["granted"]
    assert_memory_equals_store(c, path, clock)
    store.close()


def test_a_ticket_granted_by_a_refused_batch_fails_with_the_store_error(setup) -> None:  # type: ignore[no-untyped-def]
    c, store, kinds, clock, path = setup
    big = c.acquire(a_request("big", vram_gib=80, priority=P1)).lease
    small = c.acquire(a_request("small", vram_gib=40, priority=P1)).lease
    queued = c.acquire(a_request("waiter", vram_gib=60, priority=P1), wait_s=60)
    assert big is not None and small is not None and queued.code is OutcomeCode.QUEUED
    store.disk_full()
    with pytest.raises(sqlite3.OperationalError, match=DISK_FULL):
        c.release(big.id)  # frees g0, the queue pump grants the waiter there, the batch is refused
    st = c.ticket(str(queued.ticket))
    assert st.state == "failed" and st.lease is None and DISK_FULL in st.reason
    assert c.leases() == sorted([big, small], key=lambda x: x.id)
    assert_memory_equals_store(c, path, clock)
    assert "granted" not in kinds[2:]
