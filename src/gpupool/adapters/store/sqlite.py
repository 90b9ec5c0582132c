"""`SqliteLeaseStore`: leases in one SQLite file (WAL journal, ``synchronous=FULL``: a commit that
returned survives power loss and ``kill -9``), compare-and-set on a ``revision`` column.

Invariants:
- one row per lease id; ``revision`` equals the JSON body's revision; ``state``/``tenant``/``ended_at``
  are copies of body fields kept as columns for the indexes; tickets likewise, one row per ticket id
  (upserted inside the same transaction as the batch's lease writes);
- ``apply`` runs inside one ``BEGIN IMMEDIATE`` transaction: every write lands or none does. Callers
  batch the writes of many concurrent requests into one call (group commit): one fsync per batch;
- every method holds the store's lock, so one store object may be used from several threads
  (the gateway commits from a worker thread while the event loop reads nothing from it);
- the WAL auto-checkpoint threshold is 10,000 pages (default 1,000): checkpoints (an extra fsync of the
  database file inside some commit) are ten times rarer. Measured on the 2-core machine, 16-write
  batches: p90 commit 3.9-5.2 ms instead of 7-10 ms. (A background PASSIVE checkpointer thread was
  measured too and doubled the median commit time, so it is not used.)
- a failed ``apply`` leaves no transaction open and raises the error SQLite reported (e.g.
  ``database or disk is full``): when SQLite has already rolled back on its own, nothing hides it;
- with ``exclusive`` (what `open_store` and so `gpupool serve` use) one process at a time writes
  the file: a second gateway on the same store is refused at open (`gpupool.adapters.store.owner`);
- a file whose ``schema_version`` is above `SCHEMA_VERSION` (written by a newer gpupool) is refused at
  open with `StoreTooNew`, before anything is written to it: this version would read its rows
  wrongly and write rows of the old layout into it;
- damage is named, never a raw traceback: a file that is not a database, a malformed page (every
  page is verified with ``PRAGMA quick_check`` at open: measured 0.3 s for 100,000 leases / 48 MiB,
  1 ms without) or a row whose body does not decode raises
  `StoreCorrupt` naming the file, the table/row and the repair command (``gpupool store
  check|repair``, see `gpupool.adapters.store.repair`);
- a write waits up to ``busy_timeout_ms`` for another process's write lock (a ``sqlite3`` shell in
  ``BEGIN EXCLUSIVE``, a backup tool), then fails with ``database is locked``. While `hurry` is on
  (the gateway turns it on when a write failed and off when one succeeds) it waits at most
  `HURRIED_BUSY_TIMEOUT_MS`: a store that is refusing writes answers the next ones at once instead
  of holding every caller for the full timeout.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from gpupool.adapters.fastjson import lease_record, ticket_record
from gpupool.adapters.store import owner
from gpupool.core.errors import GpupoolError, InvalidInput, StoreDamaged
from gpupool.core.model import Lease
from gpupool.core.ports import (
    RevisionConflict,
    TicketRecord,
    Write,
    decode_lease,
    decode_ticket,
)

SCHEMA_VERSION = "1"

HURRIED_BUSY_TIMEOUT_MS = 50
"""A write's wait for another process's lock while the store is hurried (`SqliteLeaseStore.hurry`)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (
    id TEXT PRIMARY KEY,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    tenant TEXT NOT NULL,
    ended_at REAL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE INDEX IF NOT EXISTS leases_tenant ON leases(tenant);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tickets (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    ended_at REAL,
    body TEXT NOT NULL
);
"""

_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


class StoreCorrupt(StoreDamaged):
    """The store file is damaged. The message names the file, where (table/row) and what to run."""

    def __init__(self, path: Path, where: str, problem: str) -> None:
        self.path = path
        self.where = where
        self.problem = problem
        d = f"--data-dir {path.parent}" if path.name == "leases.db" else f"--db {path}"
        super().__init__(
            f"lease store {path} is damaged ({where}: {problem}); run `gpupool store check {d}` to list"
            f" the damage and `gpupool store repair {d}` to quarantine it"
        )


class StoreTooNew(GpupoolError):
    """The store file was written by a newer gpupool (its ``schema_version`` is above
    `SCHEMA_VERSION`): this version neither serves from it nor repairs it."""

    def __init__(self, path: Path, version: str) -> None:
        self.path = path
        self.version = version
        super().__init__(
            f"lease store {path} has schema_version {version}, newer than the {SCHEMA_VERSION} this gpupool"
            " reads and writes; run the gpupool version that wrote it (or a later one), or start from a"
            " backup taken before the upgrade"
        )


def schema_version(db: sqlite3.Connection) -> str | None:
    """The file's ``meta`` ``schema_version`` (None: no such table, column or entry yet)."""
    with contextlib.suppress(sqlite3.OperationalError):  # (no meta table, or another program's)
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return None if row is None else str(row[0])
    return None


def is_newer_schema(version: str | None) -> bool:
    """True for a ``schema_version`` a later gpupool wrote (a whole number above `SCHEMA_VERSION`)."""
    if version is None or not (version.isascii() and version.isdigit()):
        return False
    return int(version) > int(SCHEMA_VERSION)


def is_corruption(exc: BaseException) -> bool:
    """True for SQLite's "malformed image" / "not a database" errors (not for a full disk or a lock)."""
    return isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorname", "") in _CORRUPT


T = TypeVar("T")


def _decoded(row_id: str, body: str, decode: Callable[[str], T]) -> T:
    """``decode(body)`` of one row; `InvalidInput` (field ``body``, value the row id) saying what is wrong."""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("body", row_id, f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidInput("body", row_id, "not a JSON object")
    try:
        return decode(body)
    except InvalidInput as exc:
        raise InvalidInput("body", row_id, exc.reason) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput("body", row_id, f"not a valid row ({type(exc).__name__}: {exc})") from None


def decode_row(lease_id: str, body: str) -> Lease:
    """A ``leases`` row's body as a `Lease`; `InvalidInput` (field ``body``) saying what is wrong."""
    return _decoded(lease_id, body, decode_lease)


def decode_ticket_row(ticket: str, body: str) -> TicketRecord:
    """A ``tickets`` row's body as a `TicketRecord`; `InvalidInput` (field ``body``) saying what is wrong."""
    return _decoded(ticket, body, decode_ticket)


class SqliteLeaseStore:
    def __init__(
        self,
        path: Path | str,
        *,
        durable: bool = True,
        busy_timeout_ms: int = 10_000,
        wal_autocheckpoint_pages: int = 10_000,
        verify: bool = True,
        exclusive: bool = False,
    ) -> None:
        """``verify``: run SQLite's ``quick_check`` over every page at open (a damaged page is found at
        start-up, not by whichever request first reads it). ``exclusive``: take the store's
        one-writer-process lock first (`gpupool.adapters.store.owner`; `StoreInUse` when another
        process holds it), released by `close`."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._busy_ms = int(busy_timeout_ms)
        self._wait_ms = self._busy_ms
        self._exclusive = exclusive
        if exclusive:
            owner.claim(self.path)
        try:
            self._db = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
            )
        except BaseException:
            self._release()
            raise
        try:
            with self._named_damage("file header/schema"):
                version = schema_version(self._db)  # (first: nothing is written to a newer file)
                if is_newer_schema(version):
                    raise StoreTooNew(self.path, str(version))
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
                self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                self._db.execute(f"PRAGMA wal_autocheckpoint={int(wal_autocheckpoint_pages)}")
                self._db.executescript(_SCHEMA)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                )
                if verify:
                    found = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
                    if found != ["ok"]:
                        raise StoreCorrupt(self.path, "pages", " ".join(found[0].split()))
        except BaseException:
            self._db.close()
            self._release()
            raise
        self.commits = 0

    def _release(self) -> None:
        if self._exclusive:
            self._exclusive = False
            owner.release(self.path)

    @contextlib.contextmanager
    def _named_damage(self, where: str) -> Iterator[None]:
        """Turn SQLite's corruption errors into `StoreCorrupt` naming this file and ``where``."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if is_corruption(exc):
                raise StoreCorrupt(self.path, where, str(exc)) from None
            raise

    def _decode(self, rows: list[tuple[str, str]]) -> list[Lease]:
        out = []
        for lid, body in rows:
            try:
                out.append(decode_row(lid, body))
            except InvalidInput as exc:
                raise StoreCorrupt(self.path, f"table leases, row id={lid!r}", exc.reason) from None
        return out

    def _rollback(self) -> None:
        """Roll back if a transaction is still open; SQLite may already have (e.g. on a full disk).
        A failing ROLLBACK must not replace the error that caused it."""
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

    def hurry(self, on: bool) -> None:
        """On: writes wait at most `HURRIED_BUSY_TIMEOUT_MS` for another process's lock; off: the
        ``busy_timeout_ms`` the store was opened with."""
        ms = HURRIED_BUSY_TIMEOUT_MS if on else self._busy_ms
        with self._lock:
            if ms != self._wait_ms:
                self._db.execute(f"PRAGMA busy_timeout={ms}")
                self._wait_ms = ms

    @property
    def busy_timeout_ms(self) -> int:
        """How long a write waits now for another process's lock (see `hurry`)."""
        return self._wait_ms

    @property
    def synchronous(self) -> str:
        """The connection's ``PRAGMA synchronous`` as a name (FULL for a durable store)."""
        with self._lock:
            level = int(self._db.execute("PRAGMA synchronous").fetchone()[0])
        return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(level, str(level))

    def apply(self, writes: Sequence[Write]) -> None:
        if writes:
            self.prepare(writes)
            self.commit_prepared()

    def prepare(self, writes: Sequence[Write]) -> None:
        """Phase 1 of `apply`: run the batch's statements in an open transaction (no fsync yet).

        Holds the store lock until `commit_prepared` (which may run in another thread); on a failed
        compare-and-set it rolls back, releases the lock and raises `RevisionConflict`."""
        self._lock.acquire()
        db = self._db
        try:
            with self._named_damage("table leases"):
                db.execute("BEGIN IMMEDIATE")
                try:
                    for w in writes:
                        if isinstance(w, TicketRecord):
                            _put_ticket(db, w)
                            continue
                        lease = w.lease
                        args = (lease.revision, lease.state.value, lease.request.tenant, lease.ended_at)
                        body = lease_record(lease).decode()
                        if w.expected_revision is None:
                            cur = db.execute(
                                "INSERT OR IGNORE INTO leases(revision, state, tenant, ended_at, body, id)"
                                " VALUES (?, ?, ?, ?, ?, ?)",
                                (*args, body, lease.id),
                            )
                        else:
                            cur = db.execute(
                                "UPDATE leases SET revision=?, state=?, tenant=?, ended_at=?, body=?"
                                " WHERE id=? AND revision=?",
                                (*args, body, lease.id, w.expected_revision),
                            )
                        if cur.rowcount != 1:
                            row = db.execute("SELECT revision FROM leases WHERE id=?", (lease.id,)).fetchone()
                            actual = None if row is None else row[0]
                            raise RevisionConflict(lease.id, w.expected_revision, actual)
                except BaseException:
                    self._rollback()
                    raise
        except BaseException:
            self._lock.release()
            raise

    def commit_prepared(self) -> None:
        """Phase 2 of `apply`: COMMIT (the one fsync), then release the store lock. One C call, so a
        worker thread running it hands the GIL back and forth only once."""
        try:
            try:
                with self._named_damage("commit"):
                    self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            self.commits += 1
        finally:
            self._lock.release()

    def get(self, lease_id: str) -> Lease | None:
        with self._lock, self._named_damage("table leases"):
            row = self._db.execute("SELECT id, body FROM leases WHERE id=?", (lease_id,)).fetchone()
        return None if row is None else self._decode([row])[0]

    def active(self) -> list[Lease]:
        with self._lock, self._named_damage("table leases"):
            rows = self._db.execute("SELECT id, body FROM leases WHERE state='active' ORDER BY id").fetchall()
        return self._decode(rows)

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        with self._lock, self._named_damage("table leases"):
            if tenant is None:
                rows = self._db.execute("SELECT id, body FROM leases ORDER BY id").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT id, body FROM leases WHERE tenant=? ORDER BY id", (tenant,)
                ).fetchall()
        return self._decode(rows)

    def purge_ended(self, *, before_s: float) -> int:
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM leases WHERE state != 'active' AND ended_at IS NOT NULL AND ended_at < ?",
                (before_s,),
            )
            return cur.rowcount

    def get_ticket(self, ticket: str) -> TicketRecord | None:
        with self._lock:
            row = self._db.execute("SELECT id, body FROM tickets WHERE id=?", (ticket,)).fetchone()
        return None if row is None else self._ticket(row[0], row[1])

    def tickets(self) -> list[TicketRecord]:
        with self._lock:
            rows = self._db.execute("SELECT id, body FROM tickets ORDER BY id").fetchall()
        return [self._ticket(r[0], r[1]) for r in rows]

    def _ticket(self, ticket: str, body: str) -> TicketRecord:
        try:
            return decode_ticket_row(str(ticket), body)
        except InvalidInput as exc:
            raise StoreCorrupt(self.path, f"table tickets, row id={ticket!r}", exc.reason) from None

    def purge_tickets(self, *, before_s: float) -> int:
        with self._lock:
            cur = self._db.execute(
                "DELETE FROM tickets WHERE ended_at IS NOT NULL AND ended_at < ?", (before_s,)
            )
            return cur.rowcount

    def get_meta(self, key: str) -> str | None:
        with self._lock, self._named_damage("table meta"):
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._release()


def _put_ticket(db: sqlite3.Connection, t: TicketRecord) -> None:
    """Upsert one ticket inside the caller's open transaction."""
    db.execute(
        "INSERT INTO tickets(id, state, ended_at, body) VALUES (?, ?, ?, ?)"
        " ON CONFLICT(id) DO UPDATE SET state=excluded.state, ended_at=excluded.ended_at,"
        " body=excluded.body",
        (t.ticket, t.state, t.ended_at, ticket_record(t).decode()),
    )
