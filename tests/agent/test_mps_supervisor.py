"""The agent runs MPS for real: one control daemon per MPS GPU (a stand-in ``nvidia-cuda-mps-control``
binary that daemonizes and speaks the control protocol), limits from the leases, real client
subprocesses with the lease's environment, and the MPS fault domain -- a daemon exit or a client
fault XID resets every client, the lease holders are told, the daemon restarts with the limits
re-applied and the outage is reported. Waits are liveness bounds, not timing assertions."""

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

from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.mps import MpsGpu, MpsSupervisor
from gpupool.agent.source import GpuSample, ScriptedSource
from gpupool.core.clock import ManualClock
from tests.child_jobs import wait_for

HERE = Path(__file__).resolve().parents[1] / "adapters" / "mps"
UUID = "GPU-5e0b1c2d-0000-4000-8000-000000000001"


def lease(lid: str, mib: int, milli: int) -> dict[str, object]:
    return {"lease_id": lid, "gpu_id": "n1/0", "priority": 1, "vram_mib": mib, "compute_milli": milli}


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[MpsSupervisor]:
    binary = tmp_path / "bin" / "nvidia-cuda-mps-control"
    binary.parent.mkdir()
    binary.write_text(f"#!{sys.executable}\n" + (HERE / "standin_mps_binary.py").read_text())
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    gpu = MpsGpu("n1/0", str(tmp_path / "pipe0"), device=UUID)
    s = MpsSupervisor([gpu], log_root=str(tmp_path / "log"), binary=str(binary))
    yield s
    pid_file = tmp_path / "pipe0" / "nvidia-cuda-mps-control.pid"  # whatever the test did to the GPU list
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def control_log(tmp_path: Path) -> list[str]:
    return (tmp_path / "log" / "n1_0" / "control.log").read_text().splitlines()


def client(sup: MpsSupervisor, lid: str) -> subprocess.Popen[str]:
    env = dict(os.environ, **(sup.client_env_for(lid) or {}))
    p = subprocess.Popen(
        [sys.executable, str(HERE / "standin_mps_client.py")], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline().startswith("ready")
    return p


def test_daemon_started_with_its_own_directories_and_the_leases_limits(
    sup: MpsSupervisor, tmp_path: Path
) -> None:
    pid = sup.daemon_pid("n1/0")
    assert pid is not None and (tmp_path / "pipe0" / "control.sock").exists()
    out = sup.sync([lease("a", 8192, 300), lease("b", 4096, 200)])
    assert [k for k, _g, _d in out] == ["mps_applied"]
    log = control_log(tmp_path)
    assert f"set_default_device_pinned_mem_limit {UUID} 8192M" in log
    assert f"set_device_pinned_mem_limit {pid} {UUID} 8192M" in log
    assert sup.client_env_for("b") == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe0"),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{UUID}=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
    }


def test_fault_resets_every_client_and_the_daemon_comes_back_with_its_limits(
    sup: MpsSupervisor, tmp_path: Path
) -> None:
    clock = ManualClock(0.0)
    src = ScriptedSource([GpuSample("n1/0", 0, 0, 46068, uuid=UUID)])
    agent = NodeAgent(AgentConfig("n1"), src, {}, clock=clock, mps=sup)
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    sup.sync([lease("a", 8192, 300), lease("b", 4096, 200)])
    clients = [client(sup, "a"), client(sup, "b")]
    old = sup.daemon_pid("n1/0")
    assert old is not None
    os.kill(old, signal.SIGKILL)  # the server dies: a fatal fault of one client takes it down
    assert all(c.wait(10) == 1 for c in clients)  # every client of the server is reset
    assert wait_for(lambda: not Path(f"/proc/{old}").exists() or sup.daemon_pid("n1/0") is None)
    agent.tick()
    faults = [e for e in events if e.kind == "mps_fault"]
    assert sorted(e.lease_id for e in faults) == ["", "a", "b"]  # the GPU, then each lease holder
    (back,) = [e for e in events if e.kind == "mps_recovered"]
    assert back.latency_ms > 0
    new = sup.daemon_pid("n1/0")
    assert new is not None and new != old
    assert f"set_device_pinned_mem_limit {new} {UUID} 8192M" in control_log(tmp_path)  # re-applied
    assert client(sup, "a").poll() is None  # new clients are served again
    # a client fault XID on the MPS GPU resets it too, even though the daemon is alive
    src.inject_xid("n1/0", 43)
    events.clear()
    agent.tick()
    assert any(e.kind == "mps_fault" and "XID 43" in e.reason for e in events)
    assert sup.daemon_pid("n1/0") not in (None, new)
    agent.tick()
    events.clear()
    agent.tick()
    assert not [e for e in events if e.kind.startswith("mps_")]  # calm: nothing restarts


def test_a_gpu_leaving_mps_stops_its_daemon(sup: MpsSupervisor, tmp_path: Path) -> None:
    pid = sup.daemon_pid("n1/0")
    assert pid is not None
    (notice,) = sup.set_gpus([])
    assert notice.kind == "mps_stopped"
    assert wait_for(lambda: not (tmp_path / "pipe0" / "nvidia-cuda-mps-control.pid").exists())
    assert "quit" in control_log(tmp_path)


def test_a_missing_binary_is_reported_not_raised(tmp_path: Path) -> None:
    s = MpsSupervisor(
        [MpsGpu("n1/0", str(tmp_path / "p"))], log_root=str(tmp_path / "l"), binary="/nonexistent/mps"
    )
    (n,) = s.supervise([], 0.0)
    assert n.kind == "mps_failure" and "/nonexistent/mps" in n.detail
