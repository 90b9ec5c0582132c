"""Helpers for the agent tests: polling (a liveness wait, not a timing assertion) and a job spawner."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from gpupool.adapters.pause.procfs import proc_state

JOB = "import time\nwhile True:\n    time.sleep(0.005)\n"


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return pred()


def spawn_job() -> subprocess.Popen[bytes]:
    """A real child process in its own process group, standing in for a P2 batch job."""
    proc = subprocess.Popen([sys.executable, "-c", JOB], start_new_session=True)
    assert wait_for(lambda: proc_state(proc.pid) in ("S", "R"))
    return proc


def stopped(pid: int) -> bool:
    return proc_state(pid) in ("T", "t")


def running(pid: int) -> bool:
    return proc_state(pid) in ("S", "R")
