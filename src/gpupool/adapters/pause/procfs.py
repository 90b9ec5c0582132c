"""Reading process state from ``/proc`` (Linux): the ground truth for "is it stopped".

Role: shared by the signal and cgroup pausers, the tests and the agent benchmark.

Invariants: read-only; a process that vanished reads as None, never raises.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def proc_state(pid: int) -> str | None:
    """The one-letter state from ``/proc/PID/stat`` (``R``, ``S``, ``T`` stopped, ``Z``...), or None."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    end = raw.rfind(")")
    if end < 0 or end + 2 >= len(raw):
        return None
    return raw[end + 2]


def is_stopped(pid: int) -> bool:
    """True when the process is stopped by a signal (``T``) or traced (``t``)."""
    return proc_state(pid) in ("T", "t")


def process_group(pid: int) -> int | None:
    """The process-group id (field 5 of ``/proc/PID/stat``), or None when the process is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return int(fields[2]) if len(fields) > 2 else None


def group_members(pgid: int) -> tuple[int, ...]:
    """Live pids whose process group is ``pgid`` (scans /proc; use outside the hot path)."""
    out: list[int] = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and process_group(int(entry.name)) == pgid:
            out.append(int(entry.name))
    return tuple(sorted(out))
