"""The fresh start of `gpupool run` (no ``--keep-state``): the previous run's store files set aside.

Role: a fresh run starts from an empty lease store and batch queue, so the previous run's
``leases.db`` and ``batch.db`` (with their ``-wal``/``-shm``) must go. They were deleted before the
start went through, so a start refused afterwards (a damaged ``admin.token``, a ``batch.db`` that
is a directory, a lease store that cannot be created) had already lost them. They are now moved
into a hidden folder of the data directory (`set_aside`); once the start went through they are
deleted (`discard`), and when it was refused they are moved back (`restore`).

Invariants:
- nothing is moved before this process holds the store's lock (`gpupool.adapters.store.owner`):
  a gateway still running on the data directory keeps its files, and the start is refused;
- when there is nothing to set aside no lock is taken here (the lease store takes it when it
  opens, after the batch queue and the admin token), so a refused start on a data directory
  without a previous run leaves no lock file;
- `restore` runs only once the store this start opened is closed: it removes the store files the
  refused start made, then moves the set-aside ones back under their names (same bytes), then
  removes the hidden folder;
- only regular files are set aside; anything else is left where it is (and refuses the start).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

STORE_FILES = ("leases.db", "leases.db-wal", "leases.db-shm", "batch.db", "batch.db-wal", "batch.db-shm")
"""What a fresh `gpupool run` removes from --data-dir (the admin token stays: printed URLs keep working)."""

ASIDE_PREFIX = ".gpupool-previous-run-"


def set_aside(data_dir: Path) -> Path | None:
    """Move the previous run's store files of ``data_dir`` into a new hidden folder there and return
    it (None: nothing to set aside). Takes the store's lock first: `StoreInUse` when another process
    holds it, `OSError` when it cannot be taken; nothing is moved then."""
    from gpupool.adapters.store import owner

    present = [name for name in STORE_FILES if (data_dir / name).is_file()]
    if not present:
        return None
    owner.claim(data_dir / "leases.db")  # held for the process's life, as the store's own claim
    aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=data_dir))
    try:
        for name in present:
            (data_dir / name).replace(aside / name)
    except BaseException:
        restore(data_dir, aside)
        raise
    return aside


def restore(data_dir: Path, aside: Path) -> None:
    """Put the files `set_aside` moved back where they were (the refused start's store files, made
    after they were set aside, removed first); the store must be closed."""
    for name in STORE_FILES:
        if (aside / name).is_file():
            (aside / name).replace(data_dir / name)
        else:
            with contextlib.suppress(OSError):
                (data_dir / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        aside.rmdir()


def discard(data_dir: Path, aside: Path) -> list[Path]:
    """Delete the set-aside files (the start went through); returns the paths they had. Folders a
    fresh start killed between `set_aside` and here left behind (SIGKILL, power loss) go too: they
    hold an older run's store, which this fresh start replaces anyway (the lock is held)."""
    removed = [data_dir / name for name in STORE_FILES if (aside / name).is_file()]
    shutil.rmtree(aside, ignore_errors=True)
    for stale in data_dir.glob(ASIDE_PREFIX + "*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    return removed


__all__ = ["STORE_FILES", "discard", "restore", "set_aside"]
