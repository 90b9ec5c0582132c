"""Damaged store files for tests: a real store with leases, then one kind of damage done to it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core.model import Grant, Lease, Request
from gpupool.core.ports import StoreWrite
from gpupool.hardware.units import Resources


def a_lease(i: int) -> Lease:
    req = Request(
        id=f"r{i}", tenant="t", priority=50, demand=Resources(100, 10), ttl_s=3600.0, model="", labels=()
    )
    return Lease(
        id=f"lease-{i:03d}",
        request=req,
        node="gpu-a",
        grants=(Grant("gpu-a/0/mig-3g.40gb-0", "gpu-a/0", Resources(100, 10)),),
        granted_at=1.0,
        expires_at=4e9,
    )


def a_store(path: Path, n: int = 30) -> list[Lease]:
    leases = [a_lease(i) for i in range(n)]
    s = SqliteLeaseStore(path)
    s.apply([StoreWrite(x, None) for x in leases])
    s.close()  # the last connection checkpoints the WAL into the file
    return leases


def bad_json_row(path: Path, lease_id: str, body: str = '{"id": oops') -> None:
    db = sqlite3.connect(path)
    db.execute("UPDATE leases SET body=? WHERE id=?", (body, lease_id))
    db.commit()
    db.close()


def truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def overwrite(path: Path, page: int = 2, page_size: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    data[page * page_size : page * page_size + 3000] = b"\xff" * 3000
    path.write_bytes(bytes(data))


def not_a_database(path: Path) -> None:
    path.write_bytes(b"this is not a database, it is a text file\n" * 200)
