"""cuda-checkpoint pauser: detection is reported, never assumed; refusals come with a reason; toggling
runs the real binary interface (a stand-in executable on PATH that records its arguments)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from gpupool.adapters.pause.cuda_checkpoint import CudaCheckpointPauser, detect, driver_version
from gpupool.core.pausers import Frees, Workload

STANDIN = """
import os, sys
args = sys.argv[1:]
with open(os.environ["CC_LOG"], "a") as f:
    f.write(" ".join(args) + "\\n")
pid = args[args.index("--pid") + 1]
state_file = os.path.join(os.environ["CC_STATE"], pid)
state = open(state_file).read() if os.path.exists(state_file) else "running"
if "--get-state" in args:
    print(state)
elif "--toggle" in args:
    if pid == "666":
        print("Could not checkpoint: out of memory", file=sys.stderr)
        sys.exit(1)
    open(state_file, "w").write("checkpointed" if state == "running" else "running")
"""

NVRM = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {v}  Thu Jan 1 00:00:00 UTC 2026\nGCC version: gcc\n"


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "cuda-checkpoint"
    exe.write_text(f"#!{sys.executable}\n{STANDIN}")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "state").mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("CC_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("CC_STATE", str(tmp_path / "state"))
    return tmp_path


def _version_file(tmp_path: Path, version: str) -> Path:
    f = tmp_path / "nvidia-version"
    f.write_text(NVRM.format(v=version))
    return f


def test_detect_reports_missing_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    s = detect(version_file=_version_file(tmp_path, "570.86.15"), machine="x86_64")
    assert not s.available and "not found on PATH" in s.reason
    r = CudaCheckpointPauser(support=s).pause(Workload("L", "g", "cuda-checkpoint", pids=(1234,)))
    assert r.refused and "not found on PATH" in r.reason


def test_detect_driver_requirements(standin: Path) -> None:
    assert driver_version(_version_file(standin, "550.54.14")) == "550.54.14"
    old = detect(version_file=_version_file(standin, "535.104.05"), machine="x86_64")
    assert not old.available and "older than R550" in old.reason
    unknown = detect(version_file=standin / "absent", machine="x86_64")
    assert not unknown.available and "driver version unknown" in unknown.reason
    arm = detect(version_file=_version_file(standin, "570.86.15"), machine="aarch64")
    assert not arm.available and "x86-64" in arm.reason
    ok = detect(version_file=_version_file(standin, "570.86.15"), machine="x86_64")
    assert ok.available and ok.driver_version == "570.86.15" and ok.binary.endswith("cuda-checkpoint")


def test_refuses_mig_and_multi_process_nccl(standin: Path) -> None:
    p = CudaCheckpointPauser(
        support=detect(version_file=_version_file(standin, "570.86.15"), machine="x86_64")
    )
    mig = p.check(Workload("L", "g", "cuda-checkpoint", pids=(1234,), on_mig=True))
    assert mig is not None and "MIG" in mig
    nccl = p.check(Workload("L", "g", "cuda-checkpoint", pids=(1234, 1235), nccl_world_size=2))
    assert nccl is not None and "NCCL" in nccl
    assert "pids" in (p.check(Workload("L", "g", "cuda-checkpoint")) or "")
    assert not (standin / "calls.log").exists()  # nothing was run


def test_toggle_every_process_and_back(standin: Path) -> None:
    p = CudaCheckpointPauser(
        support=detect(version_file=_version_file(standin, "570.86.15"), machine="x86_64")
    )
    assert p.frees is Frees.COMPUTE_AND_VRAM
    w = Workload("L", "g", "cuda-checkpoint", pids=(2002, 2001), vram_mib=30000)
    r = p.pause(w)
    assert r.ok and r.vram_freed_mib == 30000, r.reason
    assert p.is_paused(w)
    assert p.resume(w).ok
    assert not p.is_paused(w)
    calls = (standin / "calls.log").read_text().splitlines()
    toggles = [c for c in calls if c.startswith("--toggle")]
    assert toggles == [
        "--toggle --pid 2001",
        "--toggle --pid 2002",
        "--toggle --pid 2001",
        "--toggle --pid 2002",
    ]


def test_toggle_failure_is_reported(standin: Path) -> None:
    p = CudaCheckpointPauser(
        support=detect(version_file=_version_file(standin, "570.86.15"), machine="x86_64")
    )
    r = p.pause(Workload("L", "g", "cuda-checkpoint", pids=(666,)))
    assert not r.ok and not r.refused and "out of memory" in r.reason
