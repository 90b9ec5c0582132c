"""The simulator's per-run result cache: one JSON file per run, trusted only for the inputs it was made from.

Role: `gpupool sim report` caches every (workload, policy, seed) run and every floor as a JSON file
so that an interrupted matrix resumes. `inputs_key` digests what a run depends on (the bytes of the
node and pod lists and the run's settings); `write_entry` stores it beside the result; `read_entry`
returns the result only when the file is a JSON object carrying that same key.

Invariants: a cached result is never used for other inputs (a changed pod or node list under the
same workload name, another data root, another stop point): the key differs and the run is redone.
A damaged entry (truncated JSON, not an object, another key, unreadable) reads as absent, so it is
recomputed and overwritten, never used. An entry is written to a temporary file and renamed, so an
interrupted write leaves no truncated file. A cache file that cannot be written is `CacheError`
(a `ValueError`) naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

KEY_FIELD = "inputs"


class CacheError(ValueError):
    """A cache entry that cannot be written; the message names the file."""


def inputs_key(paths: tuple[Path, ...], settings: str) -> str:
    """SHA-256 over the bytes of ``paths`` (in order) and ``settings``."""
    h = hashlib.sha256()
    for path in paths:
        data = path.read_bytes()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    h.update(settings.encode())
    return h.hexdigest()


def read_entry(path: Path, key: str) -> dict[str, object] | None:
    """The cached object at ``path`` without its key, or None when it is absent, damaged or made
    from other inputs (the caller then recomputes it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or data.get(KEY_FIELD) != key:
        return None
    return {k: v for k, v in data.items() if k != KEY_FIELD}


def check_writable(path: Path) -> None:
    """`CacheError` when something other than a file holds the entry's name (checked before the
    runs, so none is wasted on a result that cannot be stored)."""
    if path.exists() and not path.is_file():
        raise CacheError(f"cache entry {path}: not a file, cannot write it")


def write_entry(path: Path, key: str, value: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({KEY_FIELD: key, **value}), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CacheError(f"cache entry {path}: cannot write it: {exc.strerror or exc}") from None
