"""Real child processes standing in for P2 batch jobs, and a cgroup v2 directory when allowed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.pause.cgroup import cgroup_v2_root
from gpupool.adapters.pause.procfs import proc_state
from tests.adapters.pause.pause_helpers import wait_for

JOB = "import time\nwhile True:\n    time.sleep(0.005)\n"


@pytest.fixture
def batch_job() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", JOB], start_new_session=True)
    assert wait_for(lambda: proc_state(proc.pid) in ("S", "R"))
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def job_cgroup(batch_job: subprocess.Popen[bytes]) -> Iterator[Path]:
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
