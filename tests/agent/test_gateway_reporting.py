"""Reporting to a (stand-in) gateway over real HTTP: token, outbox, outage with local enforcement,
resync and catch-up, the lease ledger flowing back into the loop, and the fallback for a gateway
without the events route."""

from __future__ import annotations

import subprocess

from gpupool.adapters.pause import SignalPauser
from gpupool.agent.gateway_client import GatewayReporter
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock
from gpupool.core.pausers import Workload
from tests.agent.agent_helpers import running, stopped, wait_for
from tests.agent.standin_gateway import StandinGateway, lease_out

GPU = "n1/0"


def build(
    gw_url: str, token: str = "t0ken", **cfg: object
) -> tuple[NodeAgent, ScriptedSource, GatewayReporter, ManualClock]:
    clock = ManualClock()
    source = ScriptedSource.uniform("n1", 2, vram_total_mib=10000)
    reporter = GatewayReporter(
        gw_url, node="n1", token=token, backoff_initial_s=0.01, backoff_max_s=0.05, ledger_every_s=0.0
    )
    agent = NodeAgent(
        AgentConfig("n1", **cfg),  # type: ignore[arg-type]
        source,
        {"signal": SignalPauser(clock=clock)},
        clock=clock,
        ledger=reporter,
    )
    agent.observers.append(reporter)
    return agent, source, reporter, clock


def tick(agent: NodeAgent, clock: ManualClock) -> None:
    clock.advance(0.2)
    agent.tick()


def test_readings_in_the_gateway_schema_and_events_with_the_token() -> None:
    gw = StandinGateway()
    gw.start()
    try:
        agent, source, reporter, clock = build(gw.url)
        source.set_used_ratio(GPU, 0.9)
        tick(agent, clock)
        assert reporter.flush_once()
        body = gw.readings[-1]
        assert [g["gpu_id"] for g in body["gpus"]] == ["n1/0", "n1/1"]
        assert body["gpus"][0] == {
            "gpu_id": "n1/0",
            "vram_used_mib": 9000,
            "vram_total_mib": 10000,
            "temperature_c": 40,
            "util_pct": 0,
            "health": "ok",
            "xids": [],
        }
        post = gw.event_posts[-1]
        assert post["resync"] is True and [e["kind"] for e in post["events"]] == ["watermark_pause"]
        tick(agent, clock)
        n = len(gw.event_posts)
        assert reporter.flush_once()
        assert len(gw.event_posts) == n  # nothing new to say: no events post
        assert reporter.pending() == 0 and reporter.connected and reporter.events_supported is True
    finally:
        gw.stop()


def test_bad_token_is_retried_with_backoff_and_never_drops_events() -> None:
    gw = StandinGateway(token="right")
    gw.start()
    try:
        agent, source, reporter, clock = build(gw.url, token="wrong")
        source.set_used_ratio(GPU, 0.9)
        tick(agent, clock)
        assert not reporter.flush_once()
        assert not reporter.flush_once()
        assert reporter.failures == 2 and "401" in reporter.last_error
        assert reporter.backoff_s() == 0.02
        assert reporter.pending() == 1 and gw.readings == []
    finally:
        gw.stop()


def test_outage_keeps_enforcing_locally_then_resyncs_and_catches_up(
    batch_job: subprocess.Popen[bytes],
) -> None:
    gw = StandinGateway()
    gw.start()
    agent, source, reporter, clock = build(gw.url)
    gw.leases = [
        lease_out(
            "batch-1",
            node="n1",
            gpu_id=GPU,
            priority=-1,
            vram_mib=1500,
            labels={"gpupool.io/pauser": "signal", "gpupool.io/pgid": str(batch_job.pid)},
        ),
        lease_out("online-1", node="n1", gpu_id=GPU, priority=100, vram_mib=2000),
        lease_out("elsewhere", node="n2", gpu_id="n2/0", priority=-1, vram_mib=7),
    ]
    reporter.start()
    try:
        source.set_used_ratio(GPU, 0.30)
        # the ledger arrives through the reporter thread; the loop picks it up on a tick
        assert wait_for(lambda: (tick(agent, clock), agent.workloads.get("batch-1") is not None)[1])
        assert agent.ledger_mib == {GPU: 3500}
        gw.stop()  # ---- outage: connection refused
        source.set_used_ratio(GPU, 0.95)
        tick(agent, clock)
        assert wait_for(lambda: stopped(batch_job.pid))  # enforcement did not need the gateway
        source.set_used_ratio(GPU, 0.50)
        tick(agent, clock)
        assert wait_for(lambda: running(batch_job.pid))
        source.set_used_ratio(GPU, 0.91)
        tick(agent, clock)
        assert wait_for(lambda: stopped(batch_job.pid))
        assert wait_for(lambda: reporter.failures >= 2)
        assert reporter.pending() >= 6
        n_before = len(gw.readings)
        gw.start()  # ---- back on the same port
        assert wait_for(lambda: reporter.pending() == 0 and reporter.connected)
        assert gw.readings[n_before]["gpus"][0]["vram_used_mib"] == 9100  # current state, not history
        first_after = gw.event_posts[-1] if len(gw.event_posts) == 1 else gw.event_posts[1]
        assert first_after["resync"] is True
        assert {"lease_id": "batch-1", "gpu_id": GPU, "state": "paused"} in first_after["workloads"]
        kinds = [e["kind"] for e in gw.events()]
        assert kinds == [
            "watermark_pause",
            "paused",
            "watermark_resume",
            "resumed",
            "watermark_pause",
            "paused",
        ]
        seqs = [e["seq"] for e in gw.events()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # the lease disappears from the ledger (released at the gateway): the agent forgets it
        gw.leases = []
        assert wait_for(lambda: (tick(agent, clock), agent.workloads.get("batch-1") is None)[1])
    finally:
        reporter.stop(final_flush=False)
        gw.stop()


def test_gateway_without_events_route_still_gets_revocations(batch_job: subprocess.Popen[bytes]) -> None:
    gw = StandinGateway(events_route=False)
    gw.leases = [lease_out("p2-big", node="n1", gpu_id=GPU, priority=-1, vram_mib=3000)]
    gw.start()
    try:
        agent, source, reporter, clock = build(gw.url, revoke_after_s=0.2)
        agent.register(Workload("p2-big", GPU, "signal", vram_mib=3000, pgid=batch_job.pid))
        source.set_used_ratio(GPU, 0.97)
        tick(agent, clock)
        tick(agent, clock)  # VRAM still high after the budget: revoke
        assert batch_job.wait(timeout=10) != 0
        assert reporter.flush_once()
        assert reporter.events_supported is False
        assert gw.deleted == ["p2-big"] and gw.leases == []
        assert reporter.pending() == 0 and reporter.unsent_events == 2  # watermark_pause, paused
    finally:
        gw.stop()


def test_outbox_is_bounded_and_counts_drops() -> None:
    clock = ManualClock()
    source = ScriptedSource.uniform("n1", 1, vram_total_mib=10000)
    reporter = GatewayReporter("http://127.0.0.1:9", node="n1", token="x", outbox_limit=3)
    agent = NodeAgent(AgentConfig("n1"), source, {}, clock=clock)
    agent.observers.append(reporter)
    for ratio in (0.9, 0.5, 0.9, 0.5, 0.9):
        source.set_used_ratio("n1/0", ratio)
        tick(agent, clock)
    assert reporter.pending() == 3 and reporter.dropped_events == 2


def test_a_gateway_without_engine_directives_is_asked_again_only_after_the_retry_time() -> None:
    gw = StandinGateway()
    gw.start()
    try:
        agent, _, reporter, clock = build(gw.url)
        tick(agent, clock)
        assert reporter.flush_once(now_s=100.0)
        engines = "/v1/nodes/n1/engines"
        assert gw.gets.count(engines) == 1 and reporter.engines_supported is False
        assert reporter.take_engines() is None
        assert reporter.flush_once(now_s=101.0)
        assert gw.gets.count(engines) == 1  # remembered: not asked with every ledger fetch
        assert reporter.flush_once(now_s=100.0 + reporter.engines_retry_s)
        assert gw.gets.count(engines) == 2  # asked again (a new leader may serve it)
    finally:
        gw.stop()
