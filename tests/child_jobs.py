"""Real child processes standing in for P2 batch jobs, and a cgroup v2 directory when allowed.

Shared by the pause-adapter tests and the agent tests: their conftests import the `batch_job` and
`job_cgroup` fixtures from here. `wait_for` is a liveness wait with a generous bound, not a timing
assertion.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.adapters.pause.cgroup import cgroup_v2_root
from gpupool.adapters.pause.procfs import proc_state

JOB = "import time\nwhile True:\n    time.sleep(0.005)\n"


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return pred()


@pytest.fixture
def batch_job() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process in its own process group (session), killed and reaped afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", JOB], start_new_session=True)
    assert wait_for(lambda: proc_state(proc.pid) in ("S", "R"))
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def job_cgroup(batch_job: subprocess.Popen[bytes]) -> Iterator[Path]:
    """A fresh cgroup v2 child holding `batch_job`; skips where cgroups cannot be delegated."""
    root = cgroup_v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine")
    cg = root / f"gpupool-test-{uuid.uuid4().hex[:12]}"
    try:
        cg.mkdir()
        (cg / "cgroup.procs").write_text(str(batch_job.pid))
    except OSError as exc:
        if cg.exists():
            cg.rmdir()
        pytest.skip(f"cannot create a cgroup v2 child or move a process into it here: {exc}")
    if not (cg / "cgroup.freeze").exists():
        pytest.skip("cgroup v2 freezer (cgroup.freeze) not available")
    yield cg
    (cg / "cgroup.freeze").write_text("0")
    if batch_job.poll() is None:
        batch_job.kill()
    batch_job.wait()
    wait_for(lambda: not (cg / "cgroup.procs").read_text().strip())
    cg.rmdir()
