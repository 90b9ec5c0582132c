"""The batch queue file (``DATA_DIR/batch.db``) of `gpupool serve` and `gpupool run`, opened first.

Role: open the batch queue before the lease store opens and before an admin token is generated,
so a queue that cannot be used (not SQLite, unreadable, on read-only media) stops the start with
its one line (`StoreRefused`, exit 2) while the data directory is still as it was: no
``leases.db``, no ``admin.token``, no token printed as "shown once" that the next start would not
show again.

Invariants:
- a refused start leaves no trace of this step: when the block `batch_queue_first` guards raises
  (a damaged token or lease store after the queue opened), the queue is closed, and the file is
  removed if this start created it (with its ``-wal``/``-shm``; nothing was written to it yet),
  and so is the data directory if this start created it and it is empty again;
- an existing file is never removed; opening it changes nothing in it (the table and index are
  created only when missing, and WAL mode is what gpupool writes it in anyway).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpupool.cli.errors import ensure_dir

QUEUE_FILE = "batch.db"


def _remove(path: Path) -> None:
    for name in (path.name, f"{path.name}-wal", f"{path.name}-shm"):
        with contextlib.suppress(OSError):
            (path.parent / name).unlink(missing_ok=True)


@contextlib.contextmanager
def batch_queue_first(data_dir: Path) -> Iterator[Any]:
    """``DATA_DIR/batch.db`` opened (a `BatchJobQueue`, the data directory made if missing) for
    the start-up steps inside the block; `StoreRefused` naming the file when SQLite cannot use it.
    When the block raises, this step is undone (see the module docstring) and the error goes on."""
    from gpupool.adapters.batch.queue import BatchJobQueue

    made_dir = not data_dir.exists()
    ensure_dir("--data-dir", data_dir)
    path = data_dir / QUEUE_FILE
    created = not path.exists()

    def undo() -> None:
        if created:
            _remove(path)
        if made_dir:
            with contextlib.suppress(OSError):
                data_dir.rmdir()  # (only when empty again)

    try:
        queue = BatchJobQueue(path)
    except BaseException:
        undo()
        raise
    try:
        yield queue
    except BaseException:
        queue.close()
        undo()
        raise
