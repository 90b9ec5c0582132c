"""``gpupool agent --mps-daemons`` without ``--mps`` (as deploy/ runs it): the agent, a real
subprocess on a simulated node whose two L40S cards discovery serves by MPS, starts one control
daemon per card (a stand-in ``nvidia-cuda-mps-control`` first on PATH) with its own pipe directory
``<--mps-pipe-dir>/<index>``, and publishes those pipe directories in the node annotation the device
plugin mounts from."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.k8s.annotations import decode_pipe_dirs
from gpupool.agent.mps import MpsGpu, mps_gpus_of
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node
from tests.child_jobs import wait_for

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "adapters" / "mps" / "standin_mps_binary.py"
KEY = "gpupool.io/slices"
PID_FILE = "nvidia-cuda-mps-control.pid"


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    yield api
    api.stop()


def test_mps_gpus_of_gives_each_mps_card_its_own_daemon() -> None:
    def s(i: int, kind: SliceKind, uuid: str = "") -> Slice:
        return Slice(
            f"n/{i}/{kind.value}", "n", f"n/{i}", kind, Resources(1000, 1000), True, i, "m", uuid=uuid
        )

    got = mps_gpus_of([s(1, SliceKind.MPS), s(0, SliceKind.MPS, "GPU-x"), s(2, SliceKind.WHOLE)], "/run/mps/")
    assert got == [MpsGpu("n/0", "/run/mps/0", "GPU-x"), MpsGpu("n/1", "/run/mps/1", "1")]
    with pytest.raises(InvalidInput, match="mps_pipe_dir"):
        mps_gpus_of([], "relative")


def test_agent_starts_a_daemon_per_discovered_mps_gpu(kube: FakeApiServer, tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(f"#!{sys.executable}\n" + STANDIN.read_text())
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    pipe_root, logs = tmp_path / "pipe", tmp_path / "log"
    kube.add_node(make_node("gpu-b"))
    args = [
        sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "gpu-b", "--devices", "simulated",
        "--kube", "--kube-api", kube.url, "--mps-daemons", "--mps-pipe-dir", str(pipe_root),
        "--mps-log-dir", str(logs), "--metrics-port", "-1", "--period-ms", "50", "--duration-s", "30",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), PATH=f"{binary.parent}:{os.environ['PATH']}")
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    pid_files = [pipe_root / str(i) / PID_FILE for i in (0, 1)]
    try:
        assert wait_for(lambda: all(p.exists() for p in pid_files), timeout_s=30)
        assert wait_for(lambda: KEY in kube.nodes["gpu-b"]["metadata"].get("annotations", {}), timeout_s=30)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        for p in pid_files:
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                os.kill(int(p.read_text()), signal.SIGKILL)
    pipes = decode_pipe_dirs(kube.nodes["gpu-b"]["metadata"]["annotations"][KEY])
    assert pipes == {f"gpu-b/{i}/mps-pool": str(pipe_root / str(i)) for i in (0, 1)}, err[-2000:]
    assert {p.name for p in logs.iterdir()} == {"gpu-b_0", "gpu-b_1"}
