"""MPS limits from the lease ledger, sent to a stand-in control daemon (real subprocess on a unix
socket) that records the exact commands; the loop reports them as events."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.mps import MpsGpu, MpsLimitTable, parse_mps_spec
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock
from gpupool.core.errors import InvalidInput

DAEMON = Path(__file__).resolve().parents[1] / "adapters" / "mps" / "standin_mps_daemon.py"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    sock, log = tmp_path / "control.sock", tmp_path / "commands.log"
    proc = subprocess.Popen(
        [sys.executable, str(DAEMON), str(sock), str(log)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield sock, log
    proc.kill()
    proc.wait()


def lease(lid: str, gpu: str, vram: int, compute: int) -> dict[str, object]:
    return {"lease_id": lid, "gpu_id": gpu, "priority": 100, "vram_mib": vram, "compute_milli": compute}


def test_ledger_becomes_server_caps_and_client_envs(daemon: tuple[Path, Path]) -> None:
    sock, log = daemon
    table = MpsLimitTable([MpsGpu("n1/0", "/run/mps-n1-0", device="GPU-l40s", socket=str(sock))])
    events = table.sync(
        [lease("g", "n1/0", 4096, 200), lease("p", "n1/0", 45056, 800), lease("x", "n1/1", 9, 9)]
    )
    assert events[0][:2] == ("mps_applied", "n1/0")
    assert log.read_text().splitlines() == [
        "set_default_device_pinned_mem_limit GPU-l40s 45056M",
        "set_default_active_thread_percentage 80",
        "get_server_list",
        "set_device_pinned_mem_limit 4242 GPU-l40s 45056M",
        "set_active_thread_percentage 4242 80",
    ]
    assert table.client_env_for("g") == {
        "CUDA_MPS_PIPE_DIRECTORY": "/run/mps-n1-0",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "GPU-l40s=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20",
    }
    assert table.client_env_for("x") is None  # n1/1 is not an MPS GPU
    n = len(log.read_text().splitlines())
    assert table.sync([lease("g", "n1/0", 4096, 200), lease("p", "n1/0", 45056, 800)]) == []
    assert len(log.read_text().splitlines()) == n  # unchanged ledger: no I/O
    table.resync()
    assert table.sync([lease("g", "n1/0", 4096, 200)])[0][0] == "mps_applied"
    assert log.read_text().splitlines()[n : n + 2] == [
        "set_default_device_pinned_mem_limit GPU-l40s 4096M",
        "set_default_active_thread_percentage 20",
    ]


def test_unreachable_daemon_is_a_reported_failure(tmp_path: Path) -> None:
    table = MpsLimitTable([MpsGpu("n1/0", "/run/mps", socket=str(tmp_path / "none.sock"))])
    events = table.sync([lease("g", "n1/0", 4096, 200)])
    assert events[0][0] == "mps_failure" and "none.sock" in events[0][2]
    assert table.applied("n1/0") is None


class Feed:
    def __init__(self, leases: list[dict[str, object]]) -> None:
        self.leases: list[dict[str, object]] | None = leases

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        out, self.leases = self.leases, None
        return out


def test_loop_applies_mps_limits_on_ledger_changes(daemon: tuple[Path, Path]) -> None:
    sock, log = daemon
    clock = ManualClock()
    feed = Feed([lease("g", "n1/0", 2048, 100)])
    agent = NodeAgent(
        AgentConfig("n1"),
        ScriptedSource.uniform("n1", 1),
        {},
        clock=clock,
        ledger=feed,
        mps=MpsLimitTable([MpsGpu("n1/0", "/run/mps", socket=str(sock))]),
    )
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    agent.tick()
    assert [(e.kind, e.gpu_id) for e in events] == [("mps_applied", "n1/0")]
    assert "set_active_thread_percentage 4242 10" in log.read_text()
    agent.tick()
    assert len(events) == 1


def test_parse_mps_spec() -> None:
    assert parse_mps_spec("gpu=n1/0,pipe=/run/mps0,device=GPU-x") == MpsGpu("n1/0", "/run/mps0", "GPU-x")
    with pytest.raises(InvalidInput, match=r"mps\.pipe"):
        parse_mps_spec("gpu=n1/0,pipe=relative")
    with pytest.raises(InvalidInput, match=r"mps\.colour"):
        parse_mps_spec("gpu=n1/0,pipe=/x,colour=red")
