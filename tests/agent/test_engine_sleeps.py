"""The agent applies the gateway's engine directives with its ``vllm-sleep`` pauser: a real child process
serves vLLM's sleep API and holds simulated VRAM through the registry; a directive ``asleep`` makes the
agent call ``POST /sleep?level=1`` (the memory shrinks to the engine's context, as the device readings
show), ``awake`` calls ``POST /wake_up`` (the memory comes back); each outcome is an ``engine_*`` event
naming the engine. Bad directives, an unknown pauser and an unreachable engine are reported (the last
retried, and reported when it starts failing, reminded and cleared as the agent's other persisting
failures). Waits are liveness bounds, not timing assertions.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from gpupool.adapters.pause import default_pausers
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.holder import start_holder
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.core.clock import ManualClock
from gpupool.hardware.spec import load_cluster_spec

GPU = "n1/0"


class Feed:
    def __init__(self) -> None:
        self.engines: list[Mapping[str, object]] | None = None

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        return None

    def take_engines(self) -> Sequence[Mapping[str, object]] | None:
        out, self.engines = self.engines, None
        return out


def directive(
    state: str, endpoint: str, *, pauser: str = "vllm-sleep", eid: str = "main-1"
) -> dict[str, object]:
    return {"id": eid, "gpu_id": GPU, "endpoint": endpoint, "pauser": pauser, "level": 1, "state": state}


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


def agent_for(sim: SimulatedCluster, feed: Feed) -> tuple[NodeAgent, list[AgentEvent], ManualClock]:
    clock = ManualClock(0.0)
    agent = NodeAgent(
        AgentConfig("n1"),
        SnapshotSource(sim.source("n1"), node="n1"),
        default_pausers(clock=clock),
        clock=clock,
        ledger=feed,
    )
    agent.engine_sleeps.retry_s = 0.5
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    return agent, events, clock


def until(
    agent: NodeAgent, clock: ManualClock, events: list[AgentEvent], kind: str, limit: int = 200
) -> AgentEvent:
    for _ in range(limit):
        agent.tick()
        agent.drain()
        hit = [e for e in events if e.kind == kind]
        if hit:
            return hit[-1]
        clock.advance(0.1)
    raise AssertionError(f"no {kind} event: {[(e.kind, e.reason) for e in events]}")


def used(sim: SimulatedCluster) -> int:
    return sim.read("n1").gpu(0).memory_used_mib


def test_directives_sleep_and_wake_the_engine_through_the_vllm_sleep_pauser(node) -> None:
    sim, reg, procs = node
    engine, port = start_holder(reg, GPU, 20000, sleep_api=True, sleep_mib=512)
    procs.append(engine)
    url = f"http://127.0.0.1:{port}"
    assert used(sim) == 20000
    feed = Feed()
    agent, events, clock = agent_for(sim, feed)
    feed.engines = [directive("asleep", url)]
    ev = until(agent, clock, events, "engine_asleep")
    assert ev.lease_id == "main-1" and ev.gpu_id == GPU and ev.pauser == "vllm-sleep"
    assert ev.frees == "compute+vram" and url in ev.reason
    assert used(sim) == 512  # weights offloaded, KV dropped: only the context stays
    n = len(events)
    for _ in range(5):  # converged: nothing more is done
        agent.tick()
        agent.drain()
    assert len(events) == n
    feed.engines = [directive("awake", url)]
    ev = until(agent, clock, events, "engine_awake")
    assert ev.lease_id == "main-1" and used(sim) == 20000


def test_bad_directives_unknown_pausers_and_unreachable_engines_are_reported(node) -> None:
    sim, _, _ = node
    feed = Feed()
    agent, events, clock = agent_for(sim, feed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        feed.engines = [
            {"id": "x", "gpu_id": GPU, "state": "asleep"},
            directive("dozing", dead, eid="y"),
            directive("asleep", dead, pauser="no-such", eid="z"),
            directive("asleep", dead, eid="w"),
        ]
        until(agent, clock, events, "engine_sleep_failed")
        for _ in range(20):  # the unreachable one is retried; the unknown pauser is not
            clock.advance(0.1)
            agent.tick()
            agent.drain()
    failed = [e for e in events if e.kind == "engine_sleep_failed"]
    reasons = " | ".join(e.reason for e in failed)
    assert "engines[0]: needs string id" in reasons and "engines[1].state: 'dozing'" in reasons
    assert [e.reason for e in failed if e.lease_id == "z"] == ["unknown pauser 'no-such'"]
    # retried after retry_s (every 0.5 s here), reported once when it started failing
    assert len([e for e in failed if e.lease_id == "w"]) == 1
    assert not any(e.kind == "engine_asleep" for e in events)


def test_a_failing_engine_is_reported_when_it_starts_reminded_and_cleared_when_it_ends(node) -> None:
    """Each 2 s retry of an unreachable engine was an ``engine_sleep_failed`` event (and a warning in
    the agent's log) for as long as it lasted. Now: one event when it starts, a reminder at most
    once a minute with the count of unreported repeats, one ``failure_cleared`` when it ends."""
    sim, reg, procs = node
    feed = Feed()
    agent, events, clock = agent_for(sim, feed)

    def ticks(n: int) -> None:
        for _ in range(n):
            clock.advance(0.1)
            agent.tick()
            agent.drain()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        feed.engines = [directive("asleep", dead)]
        first = until(agent, clock, events, "engine_sleep_failed")
        ticks(50)  # about ten retries within the minute: counted, not reported
        assert [e.kind for e in events] == ["engine_sleep_failed"]
        assert first.lease_id == "main-1" and first.gpu_id == GPU and "still failing" not in first.reason
        clock.advance(60.0)
        ticks(10)
    failed = [e for e in events if e.kind == "engine_sleep_failed"]
    assert len(failed) == 2 and "still failing: " in failed[1].reason and "unreported" in failed[1].reason
    # the engine comes up at a new endpoint: it goes to sleep, and the failure is cleared, once
    engine, port = start_holder(reg, GPU, 20000, sleep_api=True, sleep_mib=512)
    procs.append(engine)
    feed.engines = [directive("asleep", f"http://127.0.0.1:{port}")]
    until(agent, clock, events, "engine_asleep")
    ticks(5)
    cleared = [e for e in events if e.kind == "failure_cleared"]
    assert len(cleared) == 1 and cleared[0].lease_id == "main-1" and cleared[0].gpu_id == GPU
    assert cleared[0].reason.startswith("engine_sleep_failed cleared after ")
    assert len([e for e in events if e.kind == "engine_sleep_failed"]) == 2


@pytest.mark.parametrize("level", [0, 3, 2**40])
def test_a_directive_with_an_unknown_sleep_level_is_reported_and_the_tick_goes_on(node, level: int) -> None:
    sim, _, _ = node
    feed = Feed()
    agent, events, clock = agent_for(sim, feed)
    feed.engines = [{**directive("asleep", "http://127.0.0.1:9"), "level": level}]
    ev = until(agent, clock, events, "engine_sleep_failed")
    assert f"engines[0].level: {level}" in ev.reason
    for _ in range(3):  # the same list again (fetched every second): skipped, reported once
        feed.engines = [{**directive("asleep", "http://127.0.0.1:9"), "level": level}]
        clock.advance(0.1)
        agent.tick()
    assert not agent.engine_sleeps.engines
    assert len([e for e in events if e.kind == "engine_sleep_failed"]) == 1


def test_a_wake_waits_while_memory_on_the_gpu_is_still_being_freed(node) -> None:
    sim, reg, procs = node
    engine, port = start_holder(reg, GPU, 20000, sleep_api=True, sleep_mib=512)
    procs.append(engine)
    url = f"http://127.0.0.1:{port}"
    feed = Feed()
    agent, events, clock = agent_for(sim, feed)
    freeing = [True]
    agent.engine_sleeps.blocked = lambda gpu: gpu == GPU and freeing[0]
    feed.engines = [directive("asleep", url)]
    until(agent, clock, events, "engine_asleep")  # sleeping is never held back
    feed.engines = [directive("awake", url)]
    for _ in range(10):
        clock.advance(0.1)
        agent.tick()
        agent.drain()
    assert not any(e.kind == "engine_awake" for e in events) and used(sim) == 512
    freeing[0] = False
    until(agent, clock, events, "engine_awake")
    assert used(sim) == 20000
