"""Preemption frees real (simulated) VRAM: real child processes hold memory on a `SimulatedCluster`
GPU through the VRAM registry; when their ledger leases end, the agent acts on them in the same tick
and a higher-priority grant on that GPU stays ``granted-pending-free`` until the device readings show
the memory back.

Covers: the SIGTERM path (a well-behaved job), the SIGKILL escalation (a job that ignores SIGTERM),
the vLLM-sleep path (an engine that shrinks to its context), a job that cannot be freed (the grant
becomes ``free-failed``, never usable), and the old behaviour without an eviction policy (the
process kept its memory). Waits are liveness bounds, not timing assertions.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpupool.adapters.pause import default_pausers
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent, NodeSnapshot
from gpupool.core.clock import ManualClock
from gpupool.hardware.spec import load_cluster_spec
from tests.agent.agent_helpers import stopped
from tests.child_jobs import wait_for

GPU = "n1/0"
CARD_MIB = 49152  # L40S-48GB


class Feed:
    def __init__(self) -> None:
        self._next: list[Mapping[str, object]] | None = None

    def set(self, leases: list[Mapping[str, object]]) -> None:
        self._next = leases

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        out, self._next = self._next, None
        return out


def p2(lease_id: str, pgid: int, mib: int, pauser: str = "signal", endpoint: str = "") -> dict[str, object]:
    labels = {"gpupool.io/pauser": pauser, "gpupool.io/pgid": str(pgid)}
    if endpoint:
        labels["gpupool.io/endpoint"] = endpoint
    return {"lease_id": lease_id, "gpu_id": GPU, "priority": -1, "vram_mib": mib, "labels": labels}


P0 = {"lease_id": "p0", "gpu_id": GPU, "priority": 2, "vram_mib": 40000, "labels": {}}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[SimulatedCluster, Path, list[subprocess.Popen[str]]]]:
    spec = load_cluster_spec({"nodes": [{"name": "n1", "gpus": [{"model": "L40S-48GB", "count": 1}]}]})
    reg = tmp_path / "vram"
    procs: list[subprocess.Popen[str]] = []
    yield SimulatedCluster(spec, vram_registry=reg), reg, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def agent_for(
    sim: SimulatedCluster, feed: Feed, policy: EvictionPolicy | None
) -> tuple[NodeAgent, list[AgentEvent]]:
    clock = ManualClock(0.0)
    agent = NodeAgent(
        AgentConfig("n1"),
        SnapshotSource(sim.source("n1"), node="n1"),
        default_pausers(clock=clock),
        clock=clock,
        ledger=feed,
        eviction=policy,
    )
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    return agent, events


def used(sim: SimulatedCluster) -> int:
    return sim.read("n1").gpu(0).memory_used_mib


def drive(agent: NodeAgent, until: object, *, step_s: float = 0.05, limit: int = 600) -> NodeSnapshot:
    """Tick (advancing the manual clock) until ``until()`` holds; a liveness bound, not a timing test."""
    clock = agent.clock
    assert isinstance(clock, ManualClock)
    snap = agent.tick()
    for _ in range(limit):
        if until():  # type: ignore[operator]
            return snap
        threading.Event().wait(step_s)  # the manual clock never runs ahead of the real children
        clock.advance(step_s)
        snap = agent.tick()
    raise AssertionError("condition not reached")


def test_sigterm_frees_memory_and_the_grant_waits_for_it(node) -> None:
    sim, reg, procs = node
    a, _ = start_holder(reg, GPU, 20000)
    b, _ = start_holder(reg, GPU, 20000)
    procs += [a, b]
    assert used(sim) == 40000
    feed = Feed()
    agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=5.0, deadline_s=30.0))
    feed.set([p2("job-a", a.pid, 20000), p2("job-b", b.pid, 20000)])
    agent.tick()
    feed.set([P0])  # the gateway preempted both jobs for a P0
    snap = agent.tick()
    kinds = [e.kind for e in events]
    assert kinds.count("evict") == 2  # acted on in the tick that saw the leases go
    assert agent.grant_state("p0") == "granted-pending-free"
    assert ("p0", GPU, "granted-pending-free") in snap.workloads
    drive(agent, lambda: agent.grant_state("p0") == "usable")
    assert used(sim) == 0 and a.wait(10) == 0 and b.wait(10) == 0
    freed = [e for e in events if e.kind == "vram_freed"]
    assert sorted(e.lease_id for e in freed) == ["job-a", "job-b"]
    assert all("freed_mib=20000 held_mib=0" in e.reason and "SIGKILL" not in e.reason for e in freed)
    usable = [e for e in events if e.kind == "grant_usable"]
    assert [e.lease_id for e in usable] == ["p0"]
    # the grant became usable only after both frees were confirmed
    assert max(e.seq for e in freed) < usable[0].seq


def test_a_job_ignoring_sigterm_is_killed_after_the_grace(node) -> None:
    sim, reg, procs = node
    a, _ = start_holder(reg, GPU, 30000, on_term="ignore")
    procs.append(a)
    feed = Feed()
    agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=0.4, deadline_s=30.0))
    feed.set([p2("job-a", a.pid, 30000)])
    agent.tick()
    feed.set([P0])
    agent.tick()
    agent.clock.advance(0.2)  # type: ignore[attr-defined]
    agent.tick()
    assert a.poll() is None and used(sim) == 30000  # still inside the grace: SIGTERM ignored
    drive(agent, lambda: agent.grant_state("p0") == "usable")
    assert a.wait(10) == -9 and used(sim) == 0
    (freed,) = [e for e in events if e.kind == "vram_freed"]
    assert "SIGTERM -> SIGKILL" in freed.reason and "freed_mib=30000" in freed.reason


def test_sleep_path_frees_memory_without_killing(node) -> None:
    sim, reg, procs = node
    eng, port = start_holder(reg, GPU, 30000, sleep_api=True, sleep_mib=512)
    procs.append(eng)
    feed = Feed()
    agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=5.0, deadline_s=30.0))
    feed.set([p2("eng", eng.pid, 30000, pauser="vllm-sleep", endpoint=f"http://127.0.0.1:{port}")])
    agent.tick()
    feed.set([P0])
    agent.tick()
    try:
        drive(agent, lambda: agent.grant_state("p0") == "usable")
    finally:
        agent.close()
    assert eng.poll() is None and used(sim) == 512  # asleep, alive, its context kept
    (freed,) = [e for e in events if e.kind == "vram_freed"]
    assert freed.pauser == "vllm-sleep" and "freed_mib=29488 held_mib=512" in freed.reason


def test_memory_that_does_not_come_back_never_makes_the_grant_usable(node) -> None:
    sim, reg, procs = node
    leak, _ = start_holder(reg, GPU, 30000, on_term="ignore")  # memory no lease accounts for
    procs.append(leak)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        feed = Feed()
        agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=0.2, deadline_s=1.0))
        feed.set([p2("job-a", stranger.pid, 30000)])
        agent.tick()
        feed.set([P0])
        agent.tick()
        drive(agent, lambda: agent.grant_state("p0") != "granted-pending-free")
    finally:
        stranger.kill()
        stranger.wait()
    assert agent.grant_state("p0") == "free-failed"
    assert leak.poll() is None and used(sim) == 30000
    kinds = [e.kind for e in events]
    assert "grant_free_failed" in kinds and "grant_usable" not in kinds


def test_without_an_eviction_policy_the_process_keeps_its_memory(node) -> None:
    """The behaviour this fixes: the workload was forgotten and its process kept the VRAM."""
    sim, reg, procs = node
    a, _ = start_holder(reg, GPU, 20000)
    procs.append(a)
    feed = Feed()
    agent, _ = agent_for(sim, feed, None)
    feed.set([p2("job-a", a.pid, 20000)])
    agent.tick()
    feed.set([P0])
    for _ in range(5):
        agent.clock.advance(0.2)  # type: ignore[attr-defined]
        agent.tick()
    assert a.poll() is None and used(sim) == 20000 and agent.workloads.get("job-a") is None
    assert agent.grant_state("p0") == "usable"  # nothing holds the grant back: it lands on held memory


def test_a_failing_freeing_pauser_escalates_to_the_signal_path(node) -> None:
    """An engine whose sleep endpoint does not answer is SIGTERMed instead; the grant still waits."""
    sim, reg, procs = node
    eng, _ = start_holder(reg, GPU, 30000)
    procs.append(eng)
    feed = Feed()
    agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=5.0, deadline_s=30.0))
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    feed.set([p2("eng", eng.pid, 30000, pauser="vllm-sleep", endpoint=dead)])
    agent.tick()
    feed.set([P0])
    agent.tick()
    try:
        drive(agent, lambda: agent.grant_state("p0") == "usable")
    finally:
        agent.close()
    assert eng.wait(10) == 0 and used(sim) == 0
    (freed,) = [e for e in events if e.kind == "vram_freed"]
    assert freed.pauser == "vllm-sleep" and "vllm-sleep failed" in freed.reason
    assert "escalating to signal-kill" in freed.reason and "SIGTERM" in freed.reason


def test_a_job_frozen_in_its_cgroup_is_freed_by_sigterm_too(node) -> None:
    """The cgroup v2 freezer lets a frozen job handle SIGTERM, so it exits inside the grace."""
    import uuid

    from gpupool.adapters.pause.cgroup import cgroup_v2_root

    sim, reg, procs = node
    root = cgroup_v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy mounted on this machine")
    a, _ = start_holder(reg, GPU, 20000)
    procs.append(a)
    cg = root / f"gpupool-test-{uuid.uuid4().hex[:12]}"
    try:
        cg.mkdir()
        (cg / "cgroup.procs").write_text(str(a.pid))
    except OSError as exc:
        if cg.exists():
            cg.rmdir()
        pytest.skip(f"cannot create a cgroup v2 child or move a process into it here: {exc}")
    try:
        feed = Feed()
        agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=30.0, deadline_s=60.0))
        lease = p2("job-a", a.pid, 20000, pauser="cgroup")
        lease["labels"] = {**lease["labels"], "gpupool.io/cgroup": str(cg)}  # type: ignore[dict-item]
        (cg / "cgroup.freeze").write_text("1")  # the agent had paused it
        assert wait_for(lambda: "frozen 1" in (cg / "cgroup.events").read_text())
        feed.set([lease])
        agent.tick()
        feed.set([P0])
        agent.tick()
        drive(agent, lambda: agent.grant_state("p0") == "usable")
        assert a.wait(10) == 0  # exited on SIGTERM well inside the 30 s grace
        (freed,) = [e for e in events if e.kind == "vram_freed"]
        assert "SIGKILL" not in freed.reason
    finally:
        (cg / "cgroup.freeze").write_text("0")
        if a.poll() is None:
            a.kill()
        a.wait()
        cg.rmdir()


def test_a_job_the_agent_had_stopped_gets_to_exit_on_sigterm(node) -> None:
    """SIGSTOPped jobs run no SIGTERM handler until continued: the agent sends SIGCONT with it."""
    sim, reg, procs = node
    a, _ = start_holder(reg, GPU, 20000)
    procs.append(a)
    a.send_signal(signal.SIGSTOP)
    assert wait_for(lambda: stopped(a.pid))
    sim.force(GPU, memory_used_mib=45000)  # pressure: the agent keeps the job paused
    feed = Feed()
    agent, events = agent_for(sim, feed, EvictionPolicy(grace_s=25.0, deadline_s=60.0))
    feed.set([p2("job-a", a.pid, 20000)])
    agent.tick()
    agent.tick()
    assert agent.workloads.get("job-a").state.value == "paused"  # type: ignore[union-attr]
    feed.set([P0])
    agent.tick()
    sim.clear(GPU)
    drive(agent, lambda: agent.grant_state("p0") == "usable")
    assert a.wait(10) == 0  # its own SIGTERM handler ran: not the SIGKILL after 25 s
    (freed,) = [e for e in events if e.kind == "vram_freed"]
    assert "SIGKILL" not in freed.reason
