"""The agent's senders against a gateway that answers garbage (`tests.agent.hostile_gateway`): every
answer is a reported failure or ignored, never the end of the thread that sends, and once the
gateway answers properly again the agent resynchronises by itself."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from gpupool.agent.gateway_client import GatewayReporter
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.publish import SlicePublisher
from gpupool.agent.source import ScriptedSource
from gpupool.core.clock import ManualClock
from tests.agent.agent_helpers import wait_for
from tests.agent.hostile_gateway import HostileGateway

TOKEN = "t0kent0ken"


@pytest.fixture
def gw() -> Iterator[HostileGateway]:
    g = HostileGateway().start()
    yield g
    g.stop()


def agent_with(url: str) -> tuple[NodeAgent, GatewayReporter]:
    clock = ManualClock()
    reporter = GatewayReporter(
        url,
        node="n1",
        token=TOKEN,
        send_every_s=0.02,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        ledger_every_s=0.0,
        config_every_s=0.0,
    )
    agent = NodeAgent(AgentConfig("n1"), ScriptedSource.uniform("n1", 1), {}, clock=clock, ledger=reporter)
    agent.observers.append(reporter)
    return agent, reporter


@pytest.mark.parametrize("mode", ["deep", "list"])
def test_reporter_thread_survives_unusable_json_and_resynchronises(gw: HostileGateway, mode: str) -> None:
    agent, reporter = agent_with(gw.url)
    reporter.start()
    try:
        gw.mode = mode
        agent.tick()
        assert wait_for(lambda: gw.count("GET", "/v1/leases") >= 2 and gw.count("GET", "/v1/pool") >= 2)
        assert reporter.take_ledger() is None and reporter.take_watermarks() is None
        gw.mode = "ok"
        gw.leases = [{"id": "L1", "node": "n1", "gpu_id": "n1/0", "priority": 0, "vram_mib": 1}]
        agent.tick()
        assert wait_for(lambda: (reporter.take_ledger() or [{}])[0].get("lease_id") == "L1")
    finally:
        reporter.stop(final_flush=False)


@pytest.mark.parametrize("mode", ["deep", "list"])
def test_slice_publisher_survives_unusable_json(gw: HostileGateway, mode: str) -> None:
    agent, _ = agent_with(gw.url)
    snap = agent.tick()
    pub = SlicePublisher("n1", device_snapshot=lambda: None, gateway=gw.url, token=TOKEN, resync_s=0.05)
    agent.observers[:] = [pub]
    pub.start()
    try:
        gw.mode = mode
        pub(snap, ())
        assert wait_for(lambda: gw.count("PUT", "/v1/nodes/n1/slices") >= 1)
        assert wait_for(lambda: pub.published >= 1)
        assert pub.last_report == {}
        gw.mode = "ok"
        n = gw.count("PUT", "/v1/nodes/n1/slices")

        def resent() -> bool:  # the thread still sends: the unchanged list again after resync_s
            pub(agent.tick(), ())
            return gw.count("PUT", "/v1/nodes/n1/slices") > n

        assert wait_for(resent)
    finally:
        pub.stop()


def test_a_redirecting_gateway_keeps_the_events_and_reports_the_redirect(gw: HostileGateway) -> None:
    from gpupool.agent.loop import AgentEvent

    agent, reporter = agent_with(gw.url)
    gw.mode = "redirect"
    reporter(agent.tick(), [AgentEvent(1, "revoke", 0.0, gpu_id="n1/0", lease_id="L1", reason="x")])
    assert not reporter.flush_once()
    assert reporter.pending() == 1 and not reporter.connected
    assert "HTTP 302 redirect" in reporter.last_error and "--gateway" in reporter.last_error
    gw.mode = "ok"
    assert reporter.flush_once()
    assert reporter.pending() == 0 and [e["lease_id"] for e in gw.events] == ["L1"]


def finishes(fn: Callable[[], object]) -> bool:
    """Run ``fn`` on a thread; True once it returned (a liveness bound, not a timing assertion)."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(60)
    return not t.is_alive()


@pytest.mark.parametrize(
    ("mode", "why"), [("trickle", "no complete answer within"), ("huge", "bytes: not read")]
)
def test_an_answer_that_never_ends_or_is_huge_is_a_bounded_failure(
    gw: HostileGateway, mode: str, why: str
) -> None:
    agent, reporter = agent_with(gw.url)
    reporter.deadline_s, reporter.max_body_bytes = 1.0, 1 << 20
    reporter(agent.tick(), [])
    gw.mode = mode
    result: list[bool] = []
    assert finishes(lambda: result.append(reporter.flush_once()))
    assert result == [False] and why in reporter.last_error and not reporter.connected
    gw.mode = "ok"
    assert reporter.flush_once() and reporter.connected  # resynchronised once it answers again


def test_slice_publisher_gives_up_on_an_answer_that_never_ends(gw: HostileGateway) -> None:
    agent, _ = agent_with(gw.url)
    pub = SlicePublisher("n1", gateway=gw.url, token=TOKEN, timeout_s=1.0)
    inv = pub.inventory(agent.tick())
    gw.mode = "trickle"
    errors: list[str] = []
    assert finishes(lambda: errors.extend(pub.publish(inv)))
    assert len(errors) == 1 and "no complete answer within" in errors[0]
    gw.mode = "ok"
    assert pub.publish(inv) == []


def test_a_refusal_that_repeats_at_every_flush_is_logged_once(
    gw: HostileGateway, caplog: pytest.LogCaptureFixture
) -> None:
    agent, reporter = agent_with(gw.url)
    gw.mode = "refuse"
    with caplog.at_level("WARNING", logger="gpupool.agent.gateway"):
        for _ in range(5):
            reporter(agent.tick(), [])
            reporter.flush_once()
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "HTTP 422" in refused[0] and "no such GPU" in refused[0]


def test_an_engine_answering_json_nested_too_deep_is_no_exception(gw: HostileGateway) -> None:
    """The engine scraper's thread and the vLLM pausers rely on `VllmControl.call` never raising."""
    from gpupool.adapters.pause.vllm import VllmControl
    from gpupool.agent.engines import Engine, EngineScraper

    gw.mode = "deep"
    control = VllmControl(timeout_s=5.0)
    try:
        ok, _, body = control.call("GET", f"{gw.url}/is_sleeping")
        assert ok and isinstance(body, str)
        assert control.is_sleeping(gw.url) is False
        scraper = EngineScraper([Engine("n1/0", gw.url)], clock=ManualClock(), control=control)
        scraper.scrape_once()
        assert [v.kv_usage for v in scraper.views("n1/0", 0.0)] == [1.0]  # no gauge: fail closed
    finally:
        control.close()


def test_a_ledger_that_cannot_be_read_while_readings_go_through_is_logged(
    gw: HostileGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Readings were accepted while ``GET /v1/leases`` failed: the agent said nothing and showed
    itself connected, while its evictions and pauses silently acted on a stale ledger."""
    agent, reporter = agent_with(gw.url)
    gw.mode = "no-ledger"
    with caplog.at_level("WARNING", logger="gpupool.agent.gateway"):
        for _ in range(4):
            reporter(agent.tick(), [])
            reporter.flush_once()
        assert reporter.ledger_failures == 4
        gw.mode = "ok"
        reporter(agent.tick(), [])
        reporter.flush_once()
    said = [r.getMessage() for r in caplog.records]
    assert sum("cannot read the lease ledger" in m and "HTTP 500" in m for m in said) == 1, said
    assert sum("lease ledger read again after 4 failures" in m for m in said) == 1, said
    assert reporter.ledger_failures == 0
