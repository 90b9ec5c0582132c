"""A ledger the agent cannot trust blindly: lease labels and engine directives with values no process
or engine can have must be reported and skipped, never crash the tick (the loop thread would die while
the process and its gateway reporter live on, posting a stale snapshot as if all were well)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gpupool.adapters.pause import default_pausers
from gpupool.adapters.pause.procfs import proc_state
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock
from tests.agent.agent_helpers import wait_for
from tests.agent.standin_gateway import StandinGateway, lease_out

GPU = "n1/0"
REPO = Path(__file__).resolve().parents[2]


class Feed:
    """The gateway's ledger and engine directives, as the reporter hands them to the loop."""

    def __init__(self) -> None:
        self.leases: list[Mapping[str, object]] | None = None
        self.engines: list[Mapping[str, object]] | None = None

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        out, self.leases = self.leases, None
        return out

    def take_engines(self) -> Sequence[Mapping[str, object]] | None:
        out, self.engines = self.engines, None
        return out


def agent_for(feed: Feed) -> tuple[NodeAgent, ScriptedSource, list[AgentEvent]]:
    clock = ManualClock(0.0)
    source = ScriptedSource.uniform("n1", 1, vram_total_mib=10000)
    agent = NodeAgent(
        AgentConfig("n1", revoke_after_s=None),
        source,
        default_pausers(clock=clock),
        clock=clock,
        ledger=feed,
        eviction=EvictionPolicy(grace_s=0.2, deadline_s=1.0),
    )
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    return agent, source, events


def run_ticks(agent: NodeAgent, n: int) -> None:
    clock = agent.clock
    assert isinstance(clock, ManualClock)
    for _ in range(n):
        clock.advance(0.2)
        agent.tick()


@pytest.mark.parametrize("label", ["pgid", "pids"])
def test_a_pid_beyond_pid_t_is_reported_and_the_tick_goes_on(label: str) -> None:
    feed = Feed()
    agent, source, events = agent_for(feed)
    huge = str(2**40)
    lease = {
        "lease_id": "huge",
        "gpu_id": GPU,
        "priority": -1,
        "vram_mib": 1000,
        "labels": {"gpupool.io/pauser": "signal", f"gpupool.io/{label}": huge},
    }
    feed.leases = [lease]
    run_ticks(agent, 1)
    source.set_used_ratio(GPU, 0.95)  # a crossing: a registered workload would be paused now
    run_ticks(agent, 2)
    feed.leases = []  # the lease ends: a registered workload would be evicted now
    run_ticks(agent, 5)
    fails = [e for e in events if e.kind == "pauser_failure" and e.lease_id == "huge"]
    assert fails and huge in fails[0].reason and f"workload.{label}" in fails[0].reason
    assert agent.workloads.get("huge") is None
    assert [e.kind for e in events if e.kind in ("evict", "paused", "revoke")] == []


def test_evicting_a_lease_that_names_the_agent_or_its_parent_signals_neither(tmp_path: Path) -> None:
    """A real ``gpupool agent`` under a parent process (its supervisor), both in one process group:
    leases naming that group, the parent's pid or the agent's own pid end, and the agent must report
    each eviction failed without sending a signal: both processes keep running."""
    gw = StandinGateway()
    gw.start()
    env = dict(os.environ, GPUPOOL_AGENT_TOKEN="t0ken", PYTHONPATH=str(REPO / "src"))
    log = tmp_path / "agent.log"
    agent_cmd = [sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "n1", "--devices"]
    agent_cmd += ["simulated", "--gateway", gw.url, "--metrics-port", "-1", "--no-publish"]
    supervisor = "import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))"
    with log.open("w") as out:
        parent = subprocess.Popen(
            [sys.executable, "-c", supervisor, *agent_cmd], stderr=out, env=env, start_new_session=True
        )
    agent_pid = 0
    try:
        assert wait_for(lambda: " pid " in log.read_text(), timeout_s=60)
        agent_pid = int(log.read_text().split(" pid ")[1].split()[0])
        group = os.getpgid(agent_pid)
        assert group == parent.pid  # (the supervisor leads the group the agent runs in)
        gw.leases = [
            lease_out(lid, node="n1", gpu_id=GPU, priority=-1, vram_mib=100, labels=labels)
            for lid, labels in (
                ("own-group", {"gpupool.io/pauser": "signal", "gpupool.io/pgid": str(group)}),
                ("parent", {"gpupool.io/pauser": "signal", "gpupool.io/pids": str(parent.pid)}),
                ("itself", {"gpupool.io/pauser": "signal", "gpupool.io/pids": str(agent_pid)}),
            )
        ]
        n = len(gw.gets)
        assert wait_for(lambda: gw.gets[n:].count("/v1/leases") >= 2)  # the agent took the ledger
        gw.leases = []
        assert wait_for(lambda: len([e for e in gw.events() if e["kind"] == "evict_failed"]) == 3)
        failed = {e["lease_id"]: e["reason"] for e in gw.events() if e["kind"] == "evict_failed"}
        assert set(failed) == {"own-group", "parent", "itself"}
        assert all("refused" in why and "SIGTERM" not in why for why in failed.values()), failed
        assert parent.poll() is None and proc_state(agent_pid) in ("S", "R")
    finally:
        if agent_pid and proc_state(agent_pid) is not None:
            os.kill(agent_pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        gw.stop()
