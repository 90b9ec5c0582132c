"""Edges of `SqliteLeaseStore` that the contract tests do not pin: the settings the store documents
(busy timeout, WAL auto-checkpoint pages, the names of the synchronous levels), the commit counter,
opening into missing folders, use from another thread, the open-time page check and its switch, a
database locked by another process at open, and the keyword-only parameters. Real SQLite files in
a temporary folder, no doubles."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.adapters.store.sqlite import StoreCorrupt
from gpupool.core.ports import StoreWrite
from tests.adapters.store.damage import a_lease, a_store, overwrite


def test_documented_defaults_read_back_from_sqlite(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    try:
        assert s._db.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
        assert s._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 10_000
    finally:
        s.close()
    t = SqliteLeaseStore(tmp_path / "other.db", busy_timeout_ms=250, wal_autocheckpoint_pages=77)
    try:
        assert t._db.execute("PRAGMA busy_timeout").fetchone()[0] == 250
        assert t._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 77
    finally:
        t.close()


@pytest.mark.parametrize(("level", "name"), [(0, "OFF"), (1, "NORMAL"), (2, "FULL"), (3, "EXTRA")])
def test_every_synchronous_level_has_its_name(tmp_path: Path, level: int, name: str) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    try:
        s._db.execute(f"PRAGMA synchronous={level}")
        assert s.synchronous == name
    finally:
        s.close()


def test_commits_counts_each_committed_batch_once(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    try:
        assert s.commits == 0
        s.apply([])  # nothing to write: no transaction, no commit
        assert s.commits == 0
        s.apply([StoreWrite(a_lease(1), None), StoreWrite(a_lease(2), None)])
        assert s.commits == 1
        s.apply([StoreWrite(a_lease(3), None)])
        assert s.commits == 2
    finally:
        s.close()


def test_opens_inside_folders_that_do_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "leases.db"
    s = SqliteLeaseStore(path)
    try:
        s.apply([StoreWrite(a_lease(1), None)])
    finally:
        s.close()
    assert path.is_file()


def test_one_store_serves_several_threads(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    errors: list[BaseException] = []
    seen: list[str] = []

    def worker() -> None:
        try:
            s.apply([StoreWrite(a_lease(5), None)])
            got = s.get("lease-005")
            seen.append("" if got is None else got.id)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert errors == [] and seen == ["lease-005"]
        assert [x.id for x in s.leases()] == ["lease-005"]
    finally:
        s.close()


def test_damaged_pages_are_found_at_open_unless_verify_is_off(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    a_store(path, n=300)  # several pages of leases, so page 3 holds rows
    overwrite(path, page=3)
    with pytest.raises(StoreCorrupt) as e:
        SqliteLeaseStore(path)  # default: verify=True
    assert "pages" in e.value.where and str(path) in str(e.value)
    s = SqliteLeaseStore(path, verify=False)  # opens; the damage shows when the page is read
    s.close()


def test_a_database_locked_by_another_process_fails_within_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("CREATE TABLE x (a INTEGER)")  # a rollback-journal file (not WAL yet)
        other.execute("BEGIN EXCLUSIVE")  # nobody else may even read it now
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            SqliteLeaseStore(path, busy_timeout_ms=200)  # waits 0.2 s, not 200 s, then says so
    finally:
        other.execute("ROLLBACK")
        other.close()
    s = SqliteLeaseStore(path, busy_timeout_ms=200)  # the lock is gone: it opens
    s.close()


def test_options_are_keyword_only(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    try:
        with pytest.raises(TypeError):
            s.leases("t")  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            s.purge_ended(1.0)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            s.purge_tickets(1.0)  # type: ignore[call-arg]
        assert s.leases(tenant="t") == [] and s.purge_ended(before_s=1.0) == 0
        assert s.purge_tickets(before_s=1.0) == 0
    finally:
        s.close()
    with pytest.raises(TypeError):
        SqliteLeaseStore(tmp_path / "x.db", False)  # type: ignore[call-arg]
    SqliteLeaseStore(path=tmp_path / "y.db").close()
