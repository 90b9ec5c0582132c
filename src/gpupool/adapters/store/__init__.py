"""Lease stores implementing `gpupool.core.ports.LeaseStore`: `MemoryLeaseStore` (reference semantics),
`SqliteLeaseStore` (WAL, compare-and-set on a revision column) and `EtcdLeaseStore` (etcd v3, Txn on
mod_revision; `gpupool.adapters.store.etcd`, imported on demand). `open_store` picks one by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.adapters.store.memory import MemoryLeaseStore
from gpupool.adapters.store.sqlite import SqliteLeaseStore
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import LeaseStore


def open_store(url: str, **etcd_options: Any) -> LeaseStore:
    """``memory:``, ``sqlite:PATH`` / ``sqlite:///ABS/PATH`` (a bare path also means SQLite) or
    ``etcd://host:port[,host:port...][/prefix/]`` (``etcds://`` for TLS; ``etcd_options`` are the
    keyword arguments of `gpupool.adapters.store.etcd.open_etcd_store`). A SQLite store is opened
    exclusive: `gpupool.adapters.store.owner.StoreInUse` while another process has it open."""
    if url in ("memory", "memory:"):
        return MemoryLeaseStore()
    if url.startswith(("etcd://", "etcds://")):
        from gpupool.adapters.store.etcd import open_etcd_store

        return open_etcd_store(url, **etcd_options)
    if url.startswith("sqlite://"):
        url = url[len("sqlite://") :]
    elif url.startswith("sqlite:"):
        url = url[len("sqlite:") :]
    if not url:
        raise InvalidInput("store", url, "expected memory:, sqlite:PATH or etcd://host:port")
    return SqliteLeaseStore(Path(url), exclusive=True)  # (one writing process: `owner`)


__all__ = ["MemoryLeaseStore", "SqliteLeaseStore", "open_store"]
