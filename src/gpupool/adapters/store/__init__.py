"""Lease stores implementing `gpupool.core.ports.LeaseStore`: `MemoryLeaseStore` (reference semantics)
and `SqliteLeaseStore` (WAL, compare-and-set on a revision column). `open_store` picks one by URL."""

from __future__ import annotations

from pathlib import Path

from gpupool.adapters.store.memory import MemoryLeaseStore
from gpupool.adapters.store.sqlite import SqliteLeaseStore
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import LeaseStore


def open_store(url: str) -> LeaseStore:
    """``memory:`` or ``sqlite:PATH`` (a bare path also means SQLite)."""
    if url in ("memory", "memory:"):
        return MemoryLeaseStore()
    if url.startswith("sqlite:"):
        url = url[len("sqlite:") :]
    if not url:
        raise InvalidInput("store", url, "expected memory: or sqlite:PATH")
    return SqliteLeaseStore(Path(url))


__all__ = ["MemoryLeaseStore", "SqliteLeaseStore", "open_store"]
