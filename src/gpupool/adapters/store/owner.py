"""One writing process per SQLite lease store: an exclusive lock on ``STORE.lock`` next to the file.

Role: the gateway keeps its ledger in memory and writes it through to the store, so two gateways
(or a gateway and a `gpupool run` that resets the data dir, or a `gpupool store repair`) on one file
would each grant the same capacity and overwrite or delete the other's leases. Whoever opens a store
for writing takes its lock first; a second process is refused with `StoreInUse` naming the file and
the holder's pid, before it reads or changes anything.

Invariants:
- the lock is a POSIX record lock (``fcntl.lockf``) on ``<resolved store path>.lock``: the kernel
  drops it when the holder exits, ``kill -9`` included, so a stale lock file never blocks a restart;
- within one process the lock is counted, not re-taken: `claim` twice and `release` twice (tests and
  tools may open one store several times in one process); the file descriptor stays open while the
  count is above zero (closing any descriptor of the file would drop a POSIX lock);
- the lock file holds the holder's pid (for the message only); it is never deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path

from gpupool.core.errors import GpupoolError


class StoreInUse(GpupoolError):
    """Another process holds the store's lock (a gateway is running on it)."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        super().__init__(
            f"lease store {path} is in use by another gpupool process ({holder}); stop it first, or give"
            " this one its own --data-dir"
        )


_mutex = threading.Lock()
_held: dict[Path, tuple[int, int]] = {}
"""Lock file -> (its open descriptor, how many claims of this process hold it)."""


def lock_path(store: Path) -> Path:
    """The lock file of the store file ``store`` (symbolic links resolved: one lock per real file)."""
    real = Path(store).resolve()
    return real.with_name(real.name + ".lock")


def claim(store: Path) -> None:
    """Take ``store``'s lock for this process, or raise `StoreInUse` (another process has it).
    `OSError` when the lock file cannot be created (a read-only or missing directory)."""
    path = lock_path(store)
    with _mutex:
        if path in _held:
            fd, n = _held[path]
            _held[path] = (fd, n + 1)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreInUse(Path(store), holder) from None
        with contextlib.suppress(OSError):  # (the pid is for messages: a full disk still locks)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[path] = (fd, 1)


def release(store: Path) -> None:
    """Give back one claim of ``store``'s lock; the last one unlocks it (a no-op if not held)."""
    path = lock_path(store)
    with _mutex:
        if path not in _held:
            return
        fd, n = _held[path]
        if n > 1:
            _held[path] = (fd, n - 1)
            return
        del _held[path]
        os.close(fd)  # (drops the lock)


def _holder(fd: int) -> str:
    """``pid N`` as the holder wrote it, or a plain description if it cannot be read."""
    try:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "its lock file is held"


__all__ = ["StoreInUse", "claim", "lock_path", "release"]
