"""SQLite store faults named as what they are: a full disk is SQLite's own error with no
transaction left open; damage is `StoreCorrupt` naming the file and the table/row; `check` finds
it and `repair` quarantines it (row damage in place, file damage by setting the file aside and
salvaging what can still be read). The store runs with ``synchronous=FULL`` (durable commits)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.adapters.store.repair import check, repair
from gpupool.adapters.store.sqlite import StoreCorrupt
from gpupool.core.ports import StoreWrite
from tests.adapters.store.damage import a_lease, a_store, bad_json_row, not_a_database, overwrite, truncate


def test_durable_store_runs_with_synchronous_full(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    try:
        assert s.synchronous == "FULL"
        assert s._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # read back from SQLite itself
        assert s._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        s.close()
    fast = SqliteLeaseStore(tmp_path / "fast.db", durable=False)
    assert fast.synchronous == "NORMAL"
    fast.close()


def test_full_disk_is_sqlites_error_and_leaves_no_transaction_open(tmp_path: Path) -> None:
    s = SqliteLeaseStore(tmp_path / "leases.db")
    pages = s._db.execute("PRAGMA page_count").fetchone()[0]
    s._db.execute(f"PRAGMA max_page_count={pages}")  # no page more: what a full disk looks like
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        s.apply([StoreWrite(a_lease(i), None) for i in range(200)])
    assert not s._db.in_transaction and s.leases() == []
    s._db.execute("PRAGMA max_page_count=1073741823")
    s.apply([StoreWrite(a_lease(1), None)])  # the lock was released, the store works again
    assert [x.id for x in s.leases()] == ["lease-001"]
    s.close()


def test_a_bad_json_row_names_the_file_and_the_row(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    a_store(path)
    bad_json_row(path, "lease-007")
    s = SqliteLeaseStore(path)
    with pytest.raises(StoreCorrupt) as e:
        s.active()
    msg = str(e.value)
    assert str(path) in msg and "table leases, row id='lease-007'" in msg and "not valid JSON" in msg
    assert f"gpupool store repair --data-dir {tmp_path}" in msg
    bad_json_row(path, "lease-007", '{"id": "lease-007"}')  # valid JSON, not a lease
    with pytest.raises(StoreCorrupt, match="row id='lease-007'"):
        s.get("lease-007")
    s.close()


@pytest.mark.parametrize("damage", [truncate, overwrite, not_a_database])
def test_a_damaged_file_names_the_file(tmp_path: Path, damage: Callable[[Path], None]) -> None:
    path = tmp_path / "leases.db"
    a_store(path)
    damage(path)
    with pytest.raises(StoreCorrupt) as e:
        s = SqliteLeaseStore(path)
        try:  # some damage only shows when the pages are read or written
            s.active()
            s.apply([StoreWrite(a_lease(999), None)])
        finally:
            s.close()
    assert str(path) in str(e.value) and "gpupool store check" in str(e.value)


def test_check_and_repair_quarantine_bad_rows_in_place(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    leases = a_store(path)
    bad_json_row(path, "lease-003")
    db = sqlite3.connect(path)
    db.execute("UPDATE leases SET tenant='someone-else' WHERE id='lease-004'")  # column != body
    db.commit()
    db.close()
    found = check(path)
    assert [p.lease_id for p in found] == ["lease-003", "lease-004"]
    assert found[0].where == "table leases, row id='lease-003'"
    assert "tenant column 'someone-else' != body 't'" in found[1].what
    report = repair(path)
    assert [p.lease_id for p in report.quarantined] == ["lease-003", "lease-004"]
    assert check(path) == []
    s = SqliteLeaseStore(path)
    assert [x.id for x in s.active()] == [x.id for x in leases if x.id not in ("lease-003", "lease-004")]
    s.close()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT tbl, id, body FROM quarantine ORDER BY id").fetchall()
    db.close()
    assert rows[0] == ("leases", "lease-003", '{"id": oops')  # the bad body is kept, not dropped
    assert [r[1] for r in rows] == ["lease-003", "lease-004"]


def test_repair_of_a_damaged_file_sets_it_aside_and_salvages_the_readable_rows(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    leases = a_store(path)
    overwrite(path)
    assert [p.where for p in check(path)] == ["file"]
    report = repair(path)
    assert report.damaged_copy is not None and report.damaged_copy.exists()
    assert report.damaged_copy.name.startswith("leases.db.damaged-")
    assert check(path) == []
    s = SqliteLeaseStore(path)
    got = s.active()
    s.close()
    assert report.salvaged == len(got) and set(got) <= set(leases)


def test_repair_of_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    not_a_database(path)
    assert "not a readable SQLite database" in check(path)[0].what
    report = repair(path)
    assert report.salvaged == 0 and report.damaged_copy is not None
    assert report.damaged_copy.read_bytes().startswith(b"this is not a database")
    assert check(path) == []


def test_two_repairs_in_the_same_second_keep_both_damaged_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpupool.adapters.store import repair as repair_module

    monkeypatch.setattr(repair_module, "_stamp", lambda: "20261206T000000Z")  # one second for both
    path = tmp_path / "leases.db"
    copies = []
    for text in (b"this is not a database: first", b"this is not a database: second"):
        path.write_bytes(text)
        report = repair(path)
        assert report.damaged_copy is not None
        copies.append(report.damaged_copy)
    assert copies[0] != copies[1]  # (the second rename overwrote the first damaged copy)
    assert [c.read_bytes() for c in copies] == [
        b"this is not a database: first",
        b"this is not a database: second",
    ]
