"""Durable batch-job queue on SQLite (standard library ``sqlite3``, WAL), next to the lease store.

Role: persist `BatchJobSpec` values and their states so that a restart loses nothing. The table
``batch_jobs`` can live in the lease store's database file (pass the same path).

Invariants:
- Every state change goes through `gpupool.core.tidal.jobs.check_transition` inside one
  ``BEGIN IMMEDIATE`` transaction; a refused change leaves the row unchanged.
- `jobs(QUEUED)` returns jobs in the core's total queue order (deadline, submission time, id);
  `claim` is a compare-and-set (QUEUED -> RUNNING), so two runners never start one job.
- `recover` (call at start-up) requeues every RUNNING or PAUSED job of a previous process: work
  is requeued, never silently dropped; ``attempts`` counts the tries.
- A write SQLite cannot take (disk full, I/O error, lock timeout) raises `StoreRefused` and
  changes nothing (each write is one statement or one transaction).
- A row that cannot be read back as a job (damaged on disk, edited by hand) raises `QueueDamaged`
  naming the file and the job id (the gateway answers 503 with it, never 500); ``jobs(damaged=...)``
  skips it instead and names it there (the runner goes on with the other jobs), and `recover` and
  `set_state` work on the state column alone, so one such row stops neither a start nor the queue.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpupool.core.errors import DuplicateId, StoreDamaged, StoreRefused, UnknownId
from gpupool.core.tidal.jobs import (
    BatchJobSpec,
    JobRecord,
    JobState,
    check_transition,
    spec_from_dict,
    validate_job,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_jobs (
  id TEXT PRIMARY KEY,
  spec TEXT NOT NULL,
  state TEXT NOT NULL,
  deadline REAL NOT NULL,
  submitted_at REAL NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  lease_id TEXT NOT NULL DEFAULT '',
  worker TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  returncode INTEGER,
  updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS batch_jobs_order ON batch_jobs (state, deadline, submitted_at, id);
"""


@contextmanager
def _refused(what: str) -> Iterator[None]:
    """SQLite's refusal of a write (not a constraint: those are the callers' answers) as `StoreRefused`."""
    try:
        yield
    except sqlite3.IntegrityError:
        raise
    except sqlite3.Error as exc:
        raise StoreRefused(f"batch queue: {what}: {exc}") from None


class QueueDamaged(StoreDamaged):
    """A ``batch_jobs`` row that is not a job; the message names the file, the row and the problem."""

    def __init__(self, path: str, job_id: str, problem: str) -> None:
        super().__init__(
            f"batch queue {path} is damaged (batch_jobs row {job_id!r}: {problem}); restore the file"
            " from a backup, or fix or delete that row with sqlite3"
        )


def _record(path: str, job_id: str, row: tuple[Any, ...]) -> JobRecord:
    """The `JobRecord` of one row (spec, state, submitted_at, attempts, lease_id, worker, reason,
    returncode); `QueueDamaged` when it is not one."""
    try:
        spec = spec_from_dict(json.loads(row[0]))
        state = JobState(row[1])
    except (TypeError, ValueError, KeyError) as exc:  # (json's and the dataclass's refusals)
        raise QueueDamaged(path, job_id, f"{type(exc).__name__}: {exc}") from None
    return JobRecord(spec, state, row[2], row[3], row[4], row[5], row[6], row[7])


class BatchJobQueue:
    def __init__(self, path: str | Path) -> None:
        """`StoreRefused` naming ``path`` when SQLite cannot open it (a full disk, read-only media)."""
        self._path = str(path)
        with _refused(f"open {path}"):
            self._db = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
        try:
            with _refused(f"open {path}"):
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.executescript(_SCHEMA)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def submit(self, spec: BatchJobSpec, *, now: float) -> JobRecord:
        validate_job(spec)
        deadline = float("inf") if spec.deadline_s is None else float(spec.deadline_s)
        try:
            with _refused(f"submit {spec.id}"):
                self._db.execute(
                    "INSERT INTO batch_jobs (id, spec, state, deadline, submitted_at, updated_at) "
                    "VALUES (?,?,?,?,?,?)",
                    (spec.id, json.dumps(asdict(spec)), JobState.QUEUED.value, deadline, now, now),
                )
        except sqlite3.IntegrityError:
            raise DuplicateId("id", spec.id) from None
        return self.get(spec.id)

    def get(self, job_id: str) -> JobRecord:
        row = self._db.execute(
            "SELECT spec, state, submitted_at, attempts, lease_id, worker, reason, returncode "
            "FROM batch_jobs WHERE id = ?",
            (job_id,),
        ).fetchone()
        if row is None:
            raise UnknownId("job", job_id)
        return _record(self._path, job_id, row)

    def jobs(
        self, state: JobState | None = None, *, damaged: dict[str, str] | None = None
    ) -> list[JobRecord]:
        """The jobs (in ``state``) in queue order. A row that is not a job raises `QueueDamaged`, or
        with ``damaged`` given is skipped and put there (job id -> that error's message)."""
        q = (
            "SELECT id, spec, state, submitted_at, attempts, lease_id, worker, reason, returncode "
            "FROM batch_jobs"
        )
        rows = (
            self._db.execute(q + " WHERE state = ? ORDER BY deadline, submitted_at, id", (state.value,))
            if state
            else self._db.execute(q + " ORDER BY deadline, submitted_at, id")
        )
        out = []
        for row in rows.fetchall():
            try:
                out.append(_record(self._path, row[0], row[1:]))
            except QueueDamaged as exc:
                if damaged is None:
                    raise
                damaged[row[0]] = str(exc)
        return out

    def claim(self, job_id: str, *, worker: str, now: float, lease_id: str) -> JobRecord | None:
        """Atomically move QUEUED ``job_id`` to RUNNING under ``lease_id``; None if it is not queued."""
        with _refused(f"claim {job_id}"):
            cur = self._db.execute(
                "UPDATE batch_jobs SET state = ?, worker = ?, lease_id = ?, attempts = attempts + 1, "
                "reason = 'started', updated_at = ? WHERE id = ? AND state = ?",
                (JobState.RUNNING.value, worker, lease_id, now, job_id, JobState.QUEUED.value),
            )
        return self.get(job_id) if cur.rowcount == 1 else None

    def transition(
        self,
        job_id: str,
        new: JobState,
        *,
        now: float,
        reason: str = "",
        lease_id: str | None = None,
        returncode: int | None = None,
    ) -> JobRecord:
        self.set_state(job_id, new, now=now, reason=reason, lease_id=lease_id, returncode=returncode)
        return self.get(job_id)

    def set_state(
        self,
        job_id: str,
        new: JobState,
        *,
        now: float,
        reason: str = "",
        lease_id: str | None = None,
        returncode: int | None = None,
    ) -> None:
        """`transition` without reading the job back: only the state column is read, so it also
        moves a row whose spec is damaged."""
        with _refused(f"move {job_id} to {new.value}"):
            self._transition(job_id, new, now=now, reason=reason, lease_id=lease_id, returncode=returncode)

    def _transition(
        self,
        job_id: str,
        new: JobState,
        *,
        now: float,
        reason: str,
        lease_id: str | None,
        returncode: int | None,
    ) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            row = self._db.execute("SELECT state FROM batch_jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise UnknownId("job", job_id)
            check_transition(job_id, JobState(row[0]), new)
            sets = ["state = ?", "reason = ?", "updated_at = ?"]
            vals: list[object] = [new.value, reason, now]
            if lease_id is not None:
                sets.append("lease_id = ?")
                vals.append(lease_id)
            if returncode is not None:
                sets.append("returncode = ?")
                vals.append(returncode)
            if new is JobState.QUEUED:
                sets += ["worker = ''", "lease_id = ''"]
            self._db.execute(f"UPDATE batch_jobs SET {', '.join(sets)} WHERE id = ?", (*vals, job_id))  # noqa: S608
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def recover(self, *, now: float) -> list[str]:
        """Requeue the RUNNING/PAUSED jobs a previous process left behind; returns their ids. Only
        the state column is read: a row whose spec is damaged is requeued too (and still named by
        every read of it)."""
        rows = self._db.execute(
            "SELECT id FROM batch_jobs WHERE state IN (?, ?) ORDER BY deadline, submitted_at, id",
            (JobState.RUNNING.value, JobState.PAUSED.value),
        ).fetchall()
        ids = [r[0] for r in rows]
        for job_id in ids:
            with _refused(f"move {job_id} to {JobState.QUEUED.value}"):
                self._transition(
                    job_id,
                    JobState.QUEUED,
                    now=now,
                    reason="recovered after restart: requeued",
                    lease_id=None,
                    returncode=None,
                )
        return ids
