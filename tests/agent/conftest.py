"""Fixtures for the agent tests: real child processes and a cgroup v2 directory when allowed."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.pause.cgroup import cgroup_v2_root
from tests.agent.agent_helpers import spawn_job, wait_for


@pytest.fixture
def batch_job() -> Iterator[subprocess.Popen[bytes]]:
    proc = spawn_job()
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def job_cgroup(batch_job: subprocess.Popen[bytes]) -> Iterator[Path]:
    root = cgroup_v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine")
    cg = root / f"gpupool-agent-test-{uuid.uuid4().hex[:12]}"
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
