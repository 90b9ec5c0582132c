"""Reading process state from ``/proc`` (Linux): the ground truth for "is it stopped".

Role: shared by the signal and cgroup pausers, the agent's evictor, the tests and the agent benchmark.

Invariants: read-only; a process that vanished reads as None, never raises. `self_target` is the
one guard every signal path asks before it signals a workload's process group or pids.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
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


def self_target(pgid: int | None, pids: Iterable[int]) -> str | None:
    """Why signalling process group ``pgid`` or ``pids`` would hit this process (the agent) or its
    parent (its supervisor), or None. A lease naming them must never be able to stop or kill the
    agent itself: nothing would then resume or report anything on the node."""
    me, parent = os.getpid(), os.getppid()
    own = {me: "the agent's own pid", parent: "the agent's parent pid"}
    if pgid is not None:
        groups = {os.getpgrp(): "the agent's own process group", **own}
        parent_group = process_group(parent)
        if parent_group is not None:
            groups.setdefault(parent_group, "the process group of the agent's parent")
        if pgid in groups:
            return f"pgid {pgid} is {groups[pgid]}: refused"
    for pid in pids:
        if pid in own:
            return f"pid {pid} is {own[pid]}: refused"
    return None
