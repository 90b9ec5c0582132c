"""Pipelined group commits on a real etcd: `EtcdLeaseStore.apply_async` and `GroupCommitter(window=2)`.

Proves:
- a commit chained to an earlier one that reached etcd after it (the chain compare alone failed)
  waits for the earlier one and is sent again: both land, in order;
- a commit chained to one that fails lands nothing (`CommitChainBroken`), whatever the order in
  which the two reached etcd;
- the committer: with a batch in flight the next one is sent at once; a batch touching a lease
  still in flight waits for it; events are delivered in batch order; when a batch fails while a
  later one is already in etcd's hands, both are undone, every waiter gets `StoreUnavailable`,
  and memory equals what etcd holds (the later batch was refused by its chain compare);
- with etcd gone, a pipelined commit raises `EtcdError` naming the endpoint (an unknown outcome
  also calls `on_write_doubt`).

The "reached etcd first" orders are made, not hoped for: the first commit's HTTP call is held at a
gate until the test opens it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.builders import a_request, a_slice
from tests.contract.store.test_etcd_store import lease

from gpupool.adapters.http.runtime import GroupCommitter, StoreUnavailable
from gpupool.adapters.store.etcd import CommitChainBroken, EtcdLeaseStore, open_etcd_store
from gpupool.adapters.store.etcd_aio import AsyncGateway
from gpupool.adapters.store.etcd_client import EtcdError
from gpupool.adapters.store.etcd_grpc import GrpcTxn
from gpupool.adapters.store.etcd_server import LocalEtcd
from gpupool.core import P1, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.model import LeaseState
from gpupool.core.ports import GatewayEvent, RevisionConflict, StoreWrite

pytestmark = pytest.mark.etcd


class Gated:
    """Wraps the store's wire (`GrpcTxn` or `AsyncGateway`): after `hold_next`, the next Txn
    waits for `release` before it is sent."""

    def __init__(self, inner: GrpcTxn | AsyncGateway) -> None:
        self.inner = inner
        self.calls = 0
        self._hold = False
        self._gate = asyncio.Event()

    def hold_next(self) -> None:
        self._hold = True
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def _turn(self) -> None:
        self.calls += 1
        if self._hold:
            self._hold = False
            await self._gate.wait()

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._turn()
        assert isinstance(self.inner, AsyncGateway)
        return await self.inner.call(path, body)

    async def txn(self, *args: Any) -> Any:
        await self._turn()
        assert isinstance(self.inner, GrpcTxn)
        return await self.inner.txn(*args)

    def close(self) -> None:
        self.inner.close()


def gated(store: EtcdLeaseStore) -> Gated:
    g = Gated(GrpcTxn(store.client) if store.wire == "grpc" else AsyncGateway(store.client))
    store._aio = g  # type: ignore[assignment]
    return g


@pytest.fixture(params=["grpc", "json"])
def wire(request: pytest.FixtureRequest) -> str:
    """The wire `apply_async` sends on: etcd's native gRPC API, or its JSON gateway."""
    return str(request.param)


def opened(url: str, wire: str, **options: Any) -> EtcdLeaseStore:
    store = open_etcd_store(url, **options)
    store.wire = wire
    return store


async def until(cond: Any, what: str, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.002)
    assert cond(), what


def test_a_commit_that_reached_etcd_first_waits_for_the_one_it_is_chained_to(
    etcd_url: str, wire: str
) -> None:
    store = opened(etcd_url, wire)

    async def scenario() -> None:
        g = gated(store)
        g.hold_next()
        first = asyncio.create_task(store.apply_async([StoreWrite(lease("a"), None)]))
        second = asyncio.create_task(store.apply_async([StoreWrite(lease("b"), None)], after=first))
        await until(lambda: g.calls == 2, "the second commit's first try")
        await asyncio.sleep(0.05)
        assert not second.done()  # refused by its chain compare: it waits for the first
        assert store.get("b") is None
        g.release()
        await first
        await second
        assert g.calls == 3  # the second was sent again once the first had landed

    asyncio.run(scenario())
    assert [x.id for x in store.active()] == ["a", "b"]
    store.close()


@pytest.mark.parametrize("held", [True, False], ids=["chained-one-first", "in-order"])
def test_a_commit_chained_to_one_that_fails_lands_nothing(etcd_url: str, held: bool, wire: str) -> None:
    store = opened(etcd_url, wire)
    other = open_etcd_store(etcd_url)

    async def scenario() -> None:
        g = gated(store)
        if held:  # the chained commit reaches etcd first
            g.hold_next()
        else:  # another writer takes "a" before the first commit is sent: it fails
            other.apply([StoreWrite(lease("a"), None)])
        first = asyncio.create_task(store.apply_async([StoreWrite(lease("a"), None)]))
        second = asyncio.create_task(store.apply_async([StoreWrite(lease("b"), None)], after=first))
        if held:
            await until(lambda: g.calls == 2, "the chained commit's first try")
            other.apply([StoreWrite(lease("a"), None)])  # now the held one fails when it goes
            g.release()
        with pytest.raises(RevisionConflict):
            await first
        with pytest.raises(CommitChainBroken):
            await second

    asyncio.run(scenario())
    assert store.get("b") is None
    assert [x.id for x in store.active()] == ["a"]
    store.close()
    other.close()


@pytest.fixture(scope="module")
def small_etcd() -> Iterator[LocalEtcd]:
    """An etcd refusing requests over 16 KiB: a big enough batch fails there, outcome known."""
    server = LocalEtcd(max_txn_ops=4096, extra_args=("--max-request-bytes", "16384"))
    server.start()
    yield server
    server.stop()


def _controller(store: EtcdLeaseStore) -> tuple[LeaseController, list[GatewayEvent]]:
    seen: list[GatewayEvent] = []
    c = LeaseController(
        [a_slice(f"g{i}", gpu=f"g{i}") for i in range(4)],
        clock=ManualClock(1000.0),
        store=store,
        sink=seen.append,
        autoflush=False,
    )
    c.recover()
    return c, seen


def test_the_committer_pipelines_and_delivers_in_batch_order(etcd_url: str, wire: str) -> None:
    store = opened(etcd_url, wire)
    c, seen = _controller(store)

    async def scenario() -> None:
        committer = GroupCommitter(c, window=3)  # (room for a third: only the lease rule holds it)
        g = gated(store)
        g.hold_next()
        one = c.acquire(a_request("one", vram_gib=10, priority=P1)).lease
        w1 = asyncio.ensure_future(committer.durable())
        await until(lambda: g.calls == 1, "the first batch sent")
        two = c.acquire(a_request("two", vram_gib=10, priority=P1)).lease
        w2 = asyncio.ensure_future(committer.durable())
        await until(lambda: g.calls == 2, "the second batch sent while the first is in flight")
        assert one is not None and two is not None
        c.renew(one.id, ttl_s=600)  # touches a lease in flight: held back until that one lands
        w3 = asyncio.ensure_future(committer.durable())
        await asyncio.sleep(0.05)
        assert g.calls == 2 and not w1.done() and not w2.done()
        g.release()
        await asyncio.gather(w1, w2, w3)
        assert g.calls >= 3
        await committer.close()

    asyncio.run(scenario())
    assert [(e.kind, e.lease.request.id) for e in seen if e.lease is not None] == [
        ("granted", "one"),
        ("granted", "two"),
        ("renewed", "one"),
    ]
    assert sorted(store.active(), key=lambda x: x.id) == sorted(c.leases(), key=lambda x: x.id)
    assert {x.id: x.revision for x in store.active()} == {x.id: x.revision for x in c.leases()}
    store.close()


def test_a_failed_batch_undoes_the_later_one_already_sent_and_memory_equals_etcd(
    small_etcd: LocalEtcd, wire: str
) -> None:
    store = opened(f"{small_etcd.url}/pipelined-{wire}/", wire, max_txn_ops=4096)
    c, seen = _controller(store)

    async def scenario() -> None:
        committer = GroupCommitter(c, window=2)
        kept = c.acquire(a_request("kept", vram_gib=10, priority=P1)).lease
        await committer.durable()
        assert kept is not None
        g = gated(store)
        g.hold_next()
        c.release(kept.id)  # batch 1: the release and 40 grants, over etcd's request size limit
        for i in range(40):
            c.acquire(a_request(f"big-{i}", vram_mib=64, priority=P1))
        w1 = asyncio.ensure_future(committer.durable())
        await until(lambda: g.calls == 1, "batch 1 sent")
        later = c.acquire(a_request("later", vram_gib=10, priority=P1)).lease
        assert later is not None
        w2 = asyncio.ensure_future(committer.durable())
        await until(lambda: g.calls == 2, "batch 2 in etcd's hands")
        g.release()
        for w in (w1, w2):
            with pytest.raises(StoreUnavailable, match="too large"):
                await w
        assert committer.failed is not None
        assert await committer.probe() is None  # etcd takes writes again (a probe write): healthy at once
        await committer.close()

    asyncio.run(scenario())
    c.check_invariants()
    mem = {x.id: (x.state, x.revision) for x in c.leases() if x.state is LeaseState.ACTIVE}
    held = {x.id: (x.state, x.revision) for x in store.active()}
    assert mem == held and [x.request.id for x in store.active()] == ["kept"]
    assert [e.kind for e in seen] == ["granted"]  # nothing of the undone batches was delivered
    store.close()


def test_with_etcd_gone_a_pipelined_commit_names_the_endpoint(tmp_path: Path, wire: str) -> None:
    server = LocalEtcd(data_dir=tmp_path, max_txn_ops=4096).start()
    store = opened(server.url, wire)
    doubts: list[EtcdError] = []
    store.on_write_doubt = doubts.append

    async def scenario() -> None:
        await store.apply_async([StoreWrite(lease("a"), None)])
        server.kill()
        with pytest.raises(EtcdError, match=server.endpoint):
            await store.apply_async([StoreWrite(lease("b"), None)])

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        store.close()
    assert len(doubts) == 1
