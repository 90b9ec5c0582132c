"""MPS control client against a stand-in daemon (real subprocess, unix socket) that records commands."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.mps import BinaryTransport, MpsControl, MpsError, MpsLimits, SocketTransport, client_env
from gpupool.core.errors import InvalidInput

HERE = Path(__file__).parent


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    pipe_dir = tmp_path / "mps"
    pipe_dir.mkdir()
    sock = pipe_dir / "control.sock"
    log = tmp_path / "commands.log"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "standin_mps_daemon.py"), str(sock), str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    yield pipe_dir, log
    proc.kill()
    proc.wait()


def sent(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_apply_lease_limits_to_a_server_sends_exact_commands(daemon: tuple[Path, Path]) -> None:
    pipe_dir, log = daemon
    mps = MpsControl(str(pipe_dir), transport=SocketTransport(pipe_dir / "control.sock"))
    limits = MpsLimits.from_grant(vram_mib=4096, compute_milli=200)
    lines = mps.apply(limits, device="GPU-1234-abcd", server_pid=4242)
    assert lines == (
        "set_device_pinned_mem_limit 4242 GPU-1234-abcd 4096M",
        "set_active_thread_percentage 4242 20",
    )
    assert sent(log) == list(lines)
    assert mps.get_device_pinned_mem_limit(4242, "GPU-1234-abcd") == "4096M"
    assert mps.get_active_thread_percentage(4242) == 20.0


def test_defaults_and_server_list(daemon: tuple[Path, Path]) -> None:
    pipe_dir, log = daemon
    mps = MpsControl(str(pipe_dir), transport=SocketTransport(pipe_dir / "control.sock"))
    assert mps.get_default_active_thread_percentage() == 100.0
    mps.apply(MpsLimits(10240, 50), device=0)
    assert mps.get_default_active_thread_percentage() == 50.0
    assert mps.get_server_list() == (4242,)
    mps.terminate_client(4242, 777)
    assert sent(log) == [
        "get_default_active_thread_percentage",
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_active_thread_percentage 50",
        "get_default_active_thread_percentage",
        "get_server_list",
        "terminate_client 4242 777",
    ]


def test_control_binary_transport_passes_the_pipe_directory(
    daemon: tuple[Path, Path], tmp_path: Path
) -> None:
    pipe_dir, log = daemon
    # A stand-in control program: an executable that finds the daemon through CUDA_MPS_PIPE_DIRECTORY.
    binary = tmp_path / "nvidia-cuda-mps-control"
    binary.write_text(f"#!{sys.executable}\n" + (HERE / "standin_mps_control.py").read_text())
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    mps = MpsControl(str(pipe_dir), transport=BinaryTransport(str(pipe_dir), binary=str(binary)))
    mps.set_device_pinned_mem_limit(4242, 1, 2048)
    mps.set_active_thread_percentage(4242, 35)
    assert mps.get_device_pinned_mem_limit(4242, 1) == "2048M"
    assert sent(log) == [
        "set_device_pinned_mem_limit 4242 1 2048M",
        "set_active_thread_percentage 4242 35",
        "get_device_pinned_mem_limit 4242 1",
    ]


def test_error_reply_raises_with_the_command(daemon: tuple[Path, Path]) -> None:
    pipe_dir, _ = daemon
    mps = MpsControl(str(pipe_dir), transport=SocketTransport(pipe_dir / "control.sock"))
    with pytest.raises(MpsError) as exc:
        mps.command("frobnicate 1")
    assert exc.value.command == "frobnicate 1"
    assert "Unrecognized" in exc.value.reply


def test_bad_values_are_refused_before_anything_is_sent(daemon: tuple[Path, Path]) -> None:
    pipe_dir, log = daemon
    mps = MpsControl(str(pipe_dir), transport=SocketTransport(pipe_dir / "control.sock"))
    with pytest.raises(InvalidInput, match="active_thread_percentage"):
        mps.set_active_thread_percentage(4242, 0)
    with pytest.raises(InvalidInput, match="pinned_mem_limit_mib"):
        mps.set_device_pinned_mem_limit(4242, 0, -5)
    with pytest.raises(InvalidInput, match=r"mps\.device"):
        mps.set_device_pinned_mem_limit(4242, "0; quit", 10)
    for dev in ("GPU-abc\nquit", "GPU-abc\n", "\u00b2"):  # a line break would end the command early
        with pytest.raises(InvalidInput, match=r"mps\.device"):
            mps.set_device_pinned_mem_limit(4242, dev, 10)
    with pytest.raises(InvalidInput, match="server_pid"):
        mps.set_active_thread_percentage(0, 10)
    assert sent(log) == []


def test_unreachable_daemon_is_an_mps_error(tmp_path: Path) -> None:
    mps = MpsControl(str(tmp_path), transport=SocketTransport(tmp_path / "nothing.sock"))
    with pytest.raises(MpsError, match=r"nothing\.sock"):
        mps.get_server_list()
    missing = MpsControl(
        str(tmp_path), transport=BinaryTransport(str(tmp_path), binary=str(tmp_path / "nope"))
    )
    with pytest.raises(MpsError, match="nope"):
        missing.get_server_list()


def test_limits_from_grant_and_client_env() -> None:
    assert MpsLimits.from_grant(vram_mib=45056, compute_milli=800) == MpsLimits(45056, 80)
    assert MpsLimits.from_grant(vram_mib=1024, compute_milli=1) == MpsLimits(1024, 1)
    assert MpsLimits.from_grant(vram_mib=1024, compute_milli=0).active_thread_percentage == 1
    assert MpsLimits.from_grant(vram_mib=1024, compute_milli=1000).active_thread_percentage == 100
    env = client_env("/run/mps-gpu0", "MIG-aaaa-bbbb", MpsLimits(4096, 20))
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps-gpu0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "MIG-aaaa-bbbb=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
    }
    assert "CUDA_MPS_DEVICE_MEM_LIMIT" not in env  # the documented name, not the doc's typo
    with pytest.raises(InvalidInput):
        MpsLimits(0, 50)


def test_quit_stops_the_daemon(daemon: tuple[Path, Path]) -> None:
    pipe_dir, _ = daemon
    mps = MpsControl(str(pipe_dir), transport=SocketTransport(pipe_dir / "control.sock"))
    mps.quit()
    deadline = time.monotonic() + 10
    while (pipe_dir / "control.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(MpsError):
        mps.get_server_list()


def test_container_side_matches_nvidias_device_plugin() -> None:
    from gpupool.adapters.mps import container_mps

    lim = MpsLimits(4096, 25)
    c = container_mps("/run/nvidia/mps/gpu-0/pipe", "GPU-1", lim, shm_directory="/run/nvidia/mps/shm")
    assert c.env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps/gpu-0/pipe"
    assert c.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "GPU-1=4096M"
    assert c.mounts == (
        ("/run/nvidia/mps/gpu-0/pipe", "/run/nvidia/mps/gpu-0/pipe"),
        ("/run/nvidia/mps/shm", "/dev/shm"),
    )
    assert not c.host_ipc
    assert container_mps("/tmp/nvidia-mps", 0, lim).host_ipc  # the host's /dev/shm: hostIPC needed
    with pytest.raises(InvalidInput, match=r"mps\.pipe_directory"):
        container_mps("relative", 0, lim)
