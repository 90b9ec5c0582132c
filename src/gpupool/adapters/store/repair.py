"""`check` and `repair` of a SQLite lease store (``gpupool store check|repair``).

Role: find what makes a store unusable at start-up and, on request, set it aside so the gateway can
start: damage is quarantined, never silently dropped.

- `check` lists problems: a file that is not a readable SQLite database, pages that fail
  ``PRAGMA integrity_check``, a ``leases``, ``meta`` or ``tickets`` table without a column the
  store reads (another program's database), a ``leases`` or ``tickets`` row whose body does not
  decode or whose columns disagree with its body, a missing or unknown ``schema_version``. It
  never writes.
- a store written by a newer gpupool (``schema_version`` above ours) is not this version's to
  repair: `check` says so and `repair` raises `StoreTooNew` before changing anything.
- `repair` of row damage moves each bad row, in one transaction, into the ``quarantine`` table
  (``tbl, id, body, problem, moved_at``) of the same file and deletes it from its table. Repair of
  file damage renames the file (with its ``-wal``/``-shm``) to ``NAME.damaged-STAMP`` (``-2``,
  ``-3``, ... after it when a copy of the same second exists: no damaged copy is overwritten), creates a
  fresh store in its place and copies into it every lease row and meta entry that can still be
  read (bad ones into ``quarantine``); if that fails (a full disk) the damaged file is put back and
  the error raised. Either way the report says what moved where; a second `check` is clean. A clean
  store is not written at all.
"""

from __future__ import annotations

import contextlib
import datetime
import sqlite3
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.adapters.store.sqlite import (
    SCHEMA_VERSION,
    SqliteLeaseStore,
    StoreTooNew,
    decode_row,
    decode_ticket_row,
    is_newer_schema,
    schema_version,
)
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import StoreWrite

QUARANTINE = """
CREATE TABLE IF NOT EXISTS quarantine (
    tbl TEXT NOT NULL, id TEXT, body TEXT, problem TEXT NOT NULL, moved_at TEXT NOT NULL
);
"""
_MAX_LISTED = 20


@dataclass(frozen=True, slots=True)
class Problem:
    where: str
    """``file``, ``table meta`` or ``table leases, row id='...'``."""
    what: str
    rowid: int | None = None
    lease_id: str | None = None
    """The row's id (a lease id, or a ticket id in table ``tickets``)."""
    body: str | None = None
    table: str = "leases"

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class RepairReport:
    quarantined: list[Problem] = field(default_factory=list)
    damaged_copy: Path | None = None
    salvaged: int = 0
    salvaged_meta: int = 0

    def lines(self, path: Path) -> list[str]:
        out = []
        if self.damaged_copy is not None:
            out.append(
                f"{path}: unreadable file moved to {self.damaged_copy}; new store with {self.salvaged} "
                f"lease row(s) and {self.salvaged_meta} meta entr(y/ies) salvaged from it"
            )
        out.extend(f"{path}: quarantined {p.where}: {p.what}" for p in self.quarantined)
        if not out:
            out.append(f"{path}: nothing to repair")
        return out


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise InvalidInput("--data-dir", str(path.parent), f"no lease store at {path}")
    return sqlite3.connect(str(path), isolation_level=None)


def _reader(path: Path) -> sqlite3.Connection:
    """A connection for reading ``path``. On read-only media SQLite cannot create the ``-shm`` file a
    WAL database needs and cannot open it at all; with no ``-wal`` left (a store closed cleanly has
    none) the file alone is the whole database, read then as immutable."""
    db = _connect(path)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        wal = path.with_name(path.name + "-wal")
        gone = not wal.exists() or wal.stat().st_size == 0
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_CANTOPEN" and gone:
            db.close()
            return sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?immutable=1", uri=True)
    except sqlite3.DatabaseError:
        pass  # (damage: `check` names it)
    return db


def check(path: Path) -> list[Problem]:
    """Every problem found in the store file at ``path`` (empty: clean). Reads only; a store on
    read-only media is read too."""
    db = _reader(path)
    try:
        try:
            found = [r[0] for r in db.execute("PRAGMA integrity_check").fetchall()]
        except sqlite3.DatabaseError as exc:
            return [Problem("file", f"{exc} (not a readable SQLite database)")]
        problems = [Problem("file", f"integrity check: {msg}") for msg in found if msg != "ok"]
        if problems:
            return problems
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "leases" not in tables or "meta" not in tables:
            return [Problem("file", f"missing table(s) {sorted({'leases', 'meta'} - tables)}")]
        problems = list(_column_problems(db, tables))
        if problems:
            return problems
        problems.extend(_row_problems(db))
        problems.extend(_ticket_problems(db))
        version = schema_version(db)
        if is_newer_schema(version):
            what = f"schema_version is {version!r}, written by a newer gpupool (this one reads"
            what += f" {SCHEMA_VERSION!r})"
            problems.append(Problem("table meta", what))
        elif version != SCHEMA_VERSION:
            have = "none" if version is None else repr(version)
            problems.append(Problem("table meta", f"schema_version is {have}, expected {SCHEMA_VERSION!r}"))
        return problems
    finally:
        db.close()


_COLUMNS = {
    "leases": ("id", "revision", "state", "tenant", "body"),
    "meta": ("key", "value"),
    "tickets": ("id", "state", "body"),
}
"""The columns `check` reads: a table without one is not this store's (a file problem: the rows
cannot be read as leases, `repair` sets the file aside)."""


def _column_problems(db: sqlite3.Connection, tables: set[str]) -> Iterator[Problem]:
    for table, wanted in _COLUMNS.items():
        if table not in tables:
            continue
        have = {str(r[1]) for r in db.execute(f"PRAGMA table_info({table})")}  # (three fixed names)
        missing = [c for c in wanted if c not in have]
        if missing:
            yield Problem("file", f"table {table} lacks column(s) {missing} (not a gpupool lease store)")


def _ticket_problems(db: sqlite3.Connection) -> Iterator[Problem]:
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "tickets" not in tables:
        return
    for rowid, tid, state, body in db.execute("SELECT rowid, id, state, body FROM tickets ORDER BY rowid"):
        where = f"table tickets, row id={tid!r}"
        try:
            t = decode_ticket_row(str(tid), body)
        except InvalidInput as exc:
            yield Problem(where, exc.reason, rowid, tid, body, table="tickets")
            continue
        if t.ticket != tid or t.state != state:
            what = f"id/state columns {tid!r}/{state!r} != body {t.ticket!r}/{t.state!r}"
            yield Problem(where, what, rowid, tid, body, table="tickets")


def _row_problems(db: sqlite3.Connection) -> Iterator[Problem]:
    for rowid, lid, rev, state, tenant, body in db.execute(
        "SELECT rowid, id, revision, state, tenant, body FROM leases ORDER BY rowid"
    ):
        where = f"table leases, row id={lid!r}"
        try:
            lease = decode_row(str(lid), body)
        except InvalidInput as exc:
            yield Problem(where, exc.reason, rowid, lid, body)
            continue
        cols = {"id": lid, "revision": rev, "state": state, "tenant": tenant}
        body_vals = {
            "id": lease.id,
            "revision": lease.revision,
            "state": lease.state.value,
            "tenant": lease.request.tenant,
        }
        wrong = [f"{k} column {cols[k]!r} != body {v!r}" for k, v in body_vals.items() if cols[k] != v]
        if wrong:
            yield Problem(where, "; ".join(wrong), rowid, lid, body)


def repair(path: Path) -> RepairReport:
    """Quarantine what `check` finds (see the module docstring); return what moved where."""
    problems = check(path)
    if not problems:
        return RepairReport()  # (no write at all: read-only media holding a clean store is fine)
    db = _reader(path)
    try:
        with contextlib.suppress(sqlite3.DatabaseError):
            version = schema_version(db)
            if is_newer_schema(version):
                raise StoreTooNew(path, str(version))
    finally:
        db.close()
    if any(p.where == "file" for p in problems):
        return _salvage(path)
    rows = [p for p in problems if p.rowid is not None]
    report = RepairReport(quarantined=rows)
    db = _connect(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(QUARANTINE)
            now = _stamp()
            for p in rows:
                db.execute(
                    "INSERT INTO quarantine(tbl, id, body, problem, moved_at) VALUES (?, ?, ?, ?, ?)",
                    (p.table, p.lease_id, p.body, p.what, now),
                )
                table = "tickets" if p.table == "tickets" else "leases"
                db.execute(f"DELETE FROM {table} WHERE rowid=?", (p.rowid,))  # noqa: S608 (two fixed names)
            if any(p.where == "table meta" for p in problems):
                db.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?)"
                    " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (SCHEMA_VERSION,),
                )
                report.quarantined.append(Problem("table meta", f"schema_version set to {SCHEMA_VERSION!r}"))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    finally:
        db.close()
    return report


def _stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def _free_name(path: Path, stem: str) -> Path:
    """``stem``, or ``stem-2``, ``stem-3``, ... : the first name next to ``path`` that no file
    (nor its ``-wal``/``-shm``) has yet. A rename would overwrite an earlier damaged copy of the
    same second."""
    n = 1
    while True:
        name = stem if n == 1 else f"{stem}-{n}"
        if not any(path.with_name(name + s).exists() for s in ("", "-wal", "-shm")):
            return path.with_name(name)
        n += 1


_SIDES = ("", "-wal", "-shm")


def _move(src: Path, dst: Path, suffixes: tuple[str, ...] = _SIDES) -> tuple[str, ...]:
    """Rename the store ``src`` with its ``-wal``/``-shm`` (those of ``suffixes`` that exist) to
    ``dst``; the suffixes moved."""
    moved = []
    for suffix in suffixes:
        side = src.with_name(src.name + suffix)
        if side.exists() or side.is_symlink():
            side.rename(dst.with_name(dst.name + suffix))
            moved.append(suffix)
    return tuple(moved)


def _salvage(path: Path) -> RepairReport:
    """Set the damaged file aside and build a new store from what it still holds. If that fails
    (a full disk, read-only media) the partial new store is removed and the damaged file put back:
    the error propagates with the files as they were, never a data dir without its store."""
    copy = _free_name(path, f"{path.name}.damaged-{_stamp()}")
    moved = _move(path, copy)
    try:
        return _rebuild(path, copy)
    except BaseException:
        for suffix in _SIDES:  # the partial new store, and what reading the copy left beside it
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + suffix).unlink()
            if suffix not in moved:
                with contextlib.suppress(FileNotFoundError):
                    copy.with_name(copy.name + suffix).unlink()
        _move(copy, path, moved)
        raise


def _rebuild(path: Path, copy: Path) -> RepairReport:
    leases, meta = _readable(copy)
    report = RepairReport(damaged_copy=copy)
    store = SqliteLeaseStore(path)
    try:
        good = []
        for lid, body in leases:
            try:
                good.append(StoreWrite(decode_row(lid, body), None))
            except InvalidInput as exc:
                where = f"table leases, row id={lid!r}"
                report.quarantined.append(Problem(where, exc.reason, None, lid, body))
        if good:
            store.apply(good)
        report.salvaged = len(good)
        for key, value in meta:
            if key != "schema_version":
                store.set_meta(key, value)
                report.salvaged_meta += 1
    finally:
        store.close()
    if report.quarantined:
        db = sqlite3.connect(str(path), isolation_level=None)
        try:
            db.execute(QUARANTINE)
            now = _stamp()
            db.executemany(
                "INSERT INTO quarantine(tbl, id, body, problem, moved_at) VALUES ('leases', ?, ?, ?, ?)",
                [(p.lease_id, p.body, p.what, now) for p in report.quarantined],
            )
        finally:
            db.close()
    return report


def _readable(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The lease rows and meta entries that can still be read from a damaged file (row by row
    when a full scan fails)."""
    leases: list[tuple[str, str]] = []
    meta: list[tuple[str, str]] = []
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return leases, meta
    try:
        for table, cols, out in (("leases", "id, body", leases), ("meta", "key, value", meta)):
            try:
                out.extend((str(a), str(b)) for a, b in db.execute(f"SELECT {cols} FROM {table}"))  # noqa: S608
                continue
            except sqlite3.DatabaseError:
                out.clear()
            with contextlib.suppress(sqlite3.DatabaseError):
                top = db.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0  # noqa: S608
                for rowid in range(1, min(int(top), 1_000_000) + 1):
                    with contextlib.suppress(sqlite3.DatabaseError):
                        row = db.execute(f"SELECT {cols} FROM {table} WHERE rowid=?", (rowid,)).fetchone()  # noqa: S608
                        if row is not None:
                            out.append((str(row[0]), str(row[1])))
    finally:
        db.close()
    return leases, meta


def summary(problems: list[Problem], path: Path) -> list[str]:
    """At most `_MAX_LISTED` lines, then a count of the rest."""
    lines = [f"{path}: {p}" for p in problems[:_MAX_LISTED]]
    if len(problems) > _MAX_LISTED:
        lines.append(f"{path}: ... and {len(problems) - _MAX_LISTED} more problem(s)")
    return lines


__all__ = ["Problem", "RepairReport", "check", "repair", "summary"]
