"""A ledger the agent cannot trust blindly: lease labels and engine directives with values no process
or engine can have must be reported and skipped, never crash the tick (the loop thread would die while
the process and its gateway reporter live on, posting a stale snapshot as if all were well)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gpupool.adapters.pause import default_pausers
from gpupool.adapters.pause.cgroup import cgroup_v2_root
from gpupool.adapters.pause.procfs import proc_state
from gpupool.adapters.simulated.holder import start_holder
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


def test_a_lease_naming_the_agents_own_cgroup_is_never_frozen(tmp_path: Path) -> None:
    """A real ``gpupool agent`` runs in a cgroup v2 child; a P2 lease names that cgroup for the freezer
    and the GPU crosses its watermark: the pause is refused and the agent keeps reading and reporting."""
    root = cgroup_v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine")
    cg = root / f"gpupool-test-{uuid.uuid4().hex[:12]}"
    try:
        cg.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v2 child here: {exc}")
    gw = StandinGateway()
    gw.start()
    reg = tmp_path / "vram"
    env = dict(
        os.environ, GPUPOOL_AGENT_TOKEN="t0ken", PYTHONPATH=str(REPO / "src"), GPUPOOL_SIM_VRAM_DIR=str(reg)
    )
    log = tmp_path / "agent.log"
    cmd = [sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "gpu-a", "--devices", "simulated"]
    cmd += ["--gateway", gw.url, "--metrics-port", "-1", "--no-publish", "--revoke-after-s", "-1"]
    with log.open("w") as out:
        agent = subprocess.Popen(cmd, stderr=out, env=env, start_new_session=True)
    holder = None
    try:
        try:
            (cg / "cgroup.procs").write_text(str(agent.pid))
        except OSError as exc:
            pytest.skip(f"cannot move a process into a cgroup v2 child here: {exc}")
        if not (cg / "cgroup.freeze").exists():
            pytest.skip("cgroup v2 freezer (cgroup.freeze) not available")
        labels = {"gpupool.io/pauser": "cgroup", "gpupool.io/cgroup": str(cg)}
        gw.leases = [
            lease_out("self", node="gpu-a", gpu_id="gpu-a/2", priority=-1, vram_mib=100, labels=labels)
        ]
        n = len(gw.gets)
        assert wait_for(lambda: gw.gets[n:].count("/v1/leases") >= 2, timeout_s=60)  # registered
        holder, _ = start_holder(reg, "gpu-a/2", 78000)  # 95 % of a whole H100: the watermark pauses P2
        assert wait_for(lambda: any(e["kind"] == "pauser_failure" for e in gw.events()), timeout_s=30)
        fail = next(e for e in gw.events() if e["kind"] == "pauser_failure")
        assert fail["lease_id"] == "self" and "refused" in fail["reason"], fail
        assert "frozen 0" in (cg / "cgroup.events").read_text()
        n = len(gw.readings)
        assert wait_for(lambda: len(gw.readings) > n + 2)  # still reading and reporting
    finally:
        (cg / "cgroup.freeze").write_text("0")
        for p in (agent, holder):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
        wait_for(lambda: not (cg / "cgroup.procs").read_text().strip())
        cg.rmdir()
        gw.stop()


def test_the_loop_outlives_a_tick_that_raises() -> None:
    """An observer (or any step) raising inside a tick must not end the loop thread."""
    import threading
    import time

    from gpupool.core.clock import FunctionClock

    agent = NodeAgent(
        AgentConfig("n1", period_s=0.01),
        ScriptedSource.uniform("n1", 1),
        {},
        clock=FunctionClock(time.monotonic),
    )

    def broken(_snap: object, _events: object) -> None:
        if agent._tick % 2:
            raise RuntimeError("observer bug")

    agent.observers.append(broken)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: agent._tick >= 10)
        assert thread.is_alive() and agent.tick_errors >= 4
    finally:
        stop.set()
        thread.join(10)
