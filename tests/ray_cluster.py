"""A local Ray head for the tests that need one, one at a time on the machine.

``ray stop`` (and ``ray stop --force``) stops every Ray process of the user, not only the cluster
the test started. With the suite spread over xdist workers, a test that stopped its head while
another worker's Ray test ran killed that test's tasks (seen as a batch job requeued mid-test).
`ray_head_cluster` therefore holds an exclusive lock file for the cluster's whole life: Ray tests
in different workers run one after the other, and stopping one never reaches another's.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

LOCK = Path(tempfile.gettempdir()) / "gpupool-tests-ray.lock"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def ray_head_cluster(temp_dir: Path, *, force_stop: bool = False) -> Iterator[str]:
    """Start a Ray head on loopback with its files under ``temp_dir`` (keep the path short: Ray's
    socket paths must fit); yields ``127.0.0.1:PORT``; stops it on exit. Skips without the CLI."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    if ray_bin is None:
        pytest.skip("the ray CLI is not on PATH")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if the test dies
        port = _free_port()
        subprocess.run(
            [ray_bin, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            check=True, env=env, capture_output=True, timeout=180,
        )  # fmt: skip
        try:
            yield f"127.0.0.1:{port}"
        finally:
            stop = [ray_bin, "stop", *(["--force"] if force_stop else [])]
            subprocess.run(stop, env=env, capture_output=True, timeout=120, check=False)
