"""Helpers for the agent tests: process-state predicates; `wait_for` (a liveness wait, not a timing
assertion) comes from `tests.child_jobs`, which also provides the child-job fixtures."""

from __future__ import annotations

from gpupool.adapters.pause.procfs import proc_state
from tests.child_jobs import wait_for

__all__ = ["running", "stopped", "wait_for"]


def stopped(pid: int) -> bool:
    return proc_state(pid) in ("T", "t")


def running(pid: int) -> bool:
    return proc_state(pid) in ("S", "R")
