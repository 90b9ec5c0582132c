"""A ledger the agent cannot trust blindly: lease labels and engine directives with values no process
or engine can have must be reported and skipped, never crash the tick (the loop thread would die while
the process and its gateway reporter live on, posting a stale snapshot as if all were well)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from gpupool.adapters.pause import default_pausers
from gpupool.agent.evict import EvictionPolicy
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock

GPU = "n1/0"


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
