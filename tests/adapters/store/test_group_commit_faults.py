"""`GroupCommitter` on a store that refuses a batch while the event loop keeps changing leases
(commit in a worker thread): the refused batch AND the changes made on top of it are undone, every
waiter gets `StoreUnavailable` with the store's error, and health comes back with the store. Also
the pipelined committer (``window=2``): two batches in flight that fail in the same loop turn are
both undone and the committer goes on committing (it once stayed stuck, refusing to send)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpupool.adapters.http.runtime import GroupCommitter, StoreUnavailable
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core import P1, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import StoreWrite
from tests.adapters.store.faulty import DISK_FULL, FaultyStore
from tests.builders import a_request, a_slice


class GatedStore(FaultyStore):
    """`apply` waits for ``gate`` (set by the test) after saying it ``entered``."""

    def __init__(self, inner: SqliteLeaseStore) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    def apply(self, writes: Sequence[StoreWrite]) -> None:
        self.entered.set()
        self.gate.wait(30)
        super().apply(writes)


async def _until(flag: threading.Event) -> None:
    while not flag.is_set():
        await asyncio.sleep(0.001)


def test_refused_batch_undoes_the_changes_made_on_top_of_it(tmp_path: Path) -> None:
    store = GatedStore(SqliteLeaseStore(tmp_path / "leases.db"))
    c = LeaseController([a_slice("g0", gpu="g0")], clock=ManualClock(1000.0), store=store, autoflush=False)
    c.recover()

    async def scenario() -> None:
        committer = GroupCommitter(c, inline=False)
        kept = c.acquire(a_request("kept", vram_gib=10, priority=P1)).lease
        await committer.durable()
        assert kept is not None and await committer.probe() is None

        store.gate.clear()
        store.entered.clear()
        first = c.acquire(a_request("first", vram_gib=10, priority=P1)).lease
        w1 = asyncio.ensure_future(committer.durable())
        await _until(store.entered)  # batch 1 is in the store's hands, the loop runs on
        assert first is not None
        c.renew(first.id, ttl_s=600)  # builds on batch 1
        c.release(kept.id)  # and a change to a durable lease
        w2 = asyncio.ensure_future(committer.durable())
        await asyncio.sleep(0)
        store.disk_full()
        store.gate.set()
        for w in (w1, w2):
            with pytest.raises(StoreUnavailable, match=DISK_FULL):
                await w
        assert c.leases() == [kept] and not c.dirty
        c.check_invariants()
        assert store.inner.active() == [kept]
        assert await committer.probe() is not None
        store.heal()
        assert await committer.probe() is None and committer.failed is None
        await committer.close()

    asyncio.run(scenario())
    store.close()


class GatedAsyncStore(FaultyStore):
    """`apply_async` (the pipelined committer's path) waits for ``gate`` and then fails or applies
    as `FaultyStore.apply` would: two batches released together settle in the same loop turn."""

    def __init__(self, inner: SqliteLeaseStore) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent = 0

    async def _go(self, writes: Sequence[StoreWrite]) -> None:
        await self.gate.wait()
        self.apply(writes)

    def apply_async(self, writes: Sequence[StoreWrite], *, after: object = None) -> object:
        self.sent += 1
        return self._go(writes)


def test_two_pipelined_batches_failing_together_are_undone_and_the_next_one_commits(tmp_path: Path) -> None:
    store = GatedAsyncStore(SqliteLeaseStore(tmp_path / "leases.db"))
    c = LeaseController([a_slice("g0", gpu="g0")], clock=ManualClock(1000.0), store=store, autoflush=False)
    c.recover()

    async def scenario() -> None:
        committer = GroupCommitter(c, window=2)
        store.gate.clear()
        c.acquire(a_request("one", vram_gib=10, priority=P1))
        w1 = asyncio.ensure_future(committer.durable())
        await asyncio.sleep(0.01)
        c.acquire(a_request("two", vram_gib=10, priority=P1))
        w2 = asyncio.ensure_future(committer.durable())
        await asyncio.sleep(0.01)
        assert store.sent == 2  # both in flight
        store.disk_full()
        store.gate.set()  # both fail in the same loop turn
        for w in (w1, w2):
            with pytest.raises(StoreUnavailable, match=DISK_FULL):
                await w
        assert c.leases() == [] and not c.dirty
        store.heal()
        three = c.acquire(a_request("three", vram_gib=10, priority=P1)).lease
        async with asyncio.timeout(5):
            await committer.durable()  # the committer is not stuck after the failure
        assert three is not None and store.inner.active() == [three]
        await committer.close()

    asyncio.run(scenario())
    store.close()
