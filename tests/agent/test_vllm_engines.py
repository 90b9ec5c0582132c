"""vLLM sleep/wake and pause/resume driven by the loop (off-thread pauser), and engine metrics
feeding the watermarks, against a stand-in engine over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gpupool.adapters.pause import VllmControl, VllmPausePauser, VllmSleepPauser
from gpupool.adapters.pause.vllm import parse_engine_metrics
from gpupool.agent.engines import Engine, EngineScraper, parse_engine_spec
from gpupool.agent.loop import AgentConfig, AgentEvent, NodeAgent
from gpupool.agent.source import ScriptedSource
from gpupool.agent.workloads import RunState
from gpupool.core.clock import ManualClock
from gpupool.core.errors import InvalidInput
from gpupool.core.pausers import Workload
from tests.agent.standin_vllm import StandinEngine, TrickleEngine

GPU = "n1/0"


@pytest.fixture
def engine() -> Iterator[StandinEngine]:
    e = StandinEngine()
    yield e
    e.close()


@pytest.fixture
def trickle() -> Iterator[TrickleEngine]:
    e = TrickleEngine()
    yield e
    e.close()


def build(
    clock: ManualClock, engines: EngineScraper | None = None, *, workers: int = 4
) -> tuple[NodeAgent, ScriptedSource, list[AgentEvent]]:
    source = ScriptedSource.uniform("n1", 1, vram_total_mib=10000)
    control = VllmControl(timeout_s=5)
    pausers = {
        "vllm-sleep": VllmSleepPauser(control=control, clock=clock),
        "vllm-pause": VllmPausePauser(control=control, clock=clock),
    }
    config = AgentConfig("n1", revoke_after_s=None, workers=workers)
    agent = NodeAgent(config, source, pausers, clock=clock, engines=engines)
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    return agent, source, events


def test_sleep_level_and_wake_through_the_loop(engine: StandinEngine) -> None:
    clock = ManualClock()
    agent, source, events = build(clock)
    agent.register(
        Workload("batch-engine", GPU, "vllm-sleep", vram_mib=4000, endpoint=engine.url, sleep_level=2)
    )
    source.set_used_ratio(GPU, 0.93)
    clock.advance(0.2)
    agent.tick()
    assert agent.workloads.get("batch-engine").state is RunState.PAUSING  # type: ignore[union-attr]
    agent.drain()
    assert engine.calls == ["/sleep?level=2&mode=keep"] and engine.sleeping == 2
    assert [e.kind for e in events] == ["watermark_pause", "paused"]
    assert events[1].frees == "compute+vram"
    assert agent.pausers["vllm-sleep"].is_paused(agent.workloads.get("batch-engine").workload)  # type: ignore[union-attr]
    source.set_used_ratio(GPU, 0.40)
    clock.advance(0.2)
    agent.tick()
    agent.drain()
    assert engine.calls == ["/sleep?level=2&mode=keep", "/wake_up"] and engine.sleeping == 0
    assert [e.kind for e in events][-2:] == ["watermark_resume", "resumed"]
    agent.close()


def test_failed_sleep_is_a_pauser_failure_and_is_retried(engine: StandinEngine) -> None:
    clock = ManualClock()
    agent, source, events = build(clock)
    agent.register(Workload("e", GPU, "vllm-sleep", vram_mib=4000, endpoint=engine.url))
    engine.fail_sleep = True
    source.set_used_ratio(GPU, 0.93)
    clock.advance(0.2)
    agent.tick()
    agent.drain()
    fails = [e for e in events if e.kind == "pauser_failure"]
    assert len(fails) == 1 and "HTTP 500" in fails[0].reason
    assert agent.workloads.get("e").state is RunState.RUNNING  # type: ignore[union-attr]
    engine.fail_sleep = False
    clock.advance(0.2)
    agent.tick()  # within retry_s: no new attempt
    assert engine.calls == ["/sleep?level=1&mode=keep"]
    clock.advance(1.0)
    agent.tick()
    agent.drain()
    assert engine.sleeping == 1 and engine.calls == ["/sleep?level=1&mode=keep", "/sleep?level=1&mode=keep"]
    agent.close()


def test_pause_keep_frees_compute_only(engine: StandinEngine) -> None:
    clock = ManualClock()
    agent, source, events = build(clock)
    w = Workload("rl", GPU, "vllm-pause", vram_mib=4000, endpoint=engine.url)
    agent.register(w)
    source.set(GPU, temperature_c=90)
    clock.advance(0.2)
    agent.tick()
    agent.drain()
    assert engine.calls == ["/pause?mode=keep"] and engine.paused
    assert [e.frees for e in events if e.kind == "paused"] == ["compute"]
    assert agent.pausers["vllm-pause"].is_paused(w)
    source.set(GPU, temperature_c=50)
    clock.advance(0.2)
    agent.tick()
    agent.drain()
    assert engine.calls[-1] == "/resume" and not engine.paused
    agent.close()


def test_engine_metrics_decide_pressure_not_raw_nvml(engine: StandinEngine) -> None:
    clock = ManualClock()
    scraper = EngineScraper([Engine(GPU, engine.url, reserved_mib=9000)], clock=clock)
    agent, source, events = build(clock, scraper)
    source.set(GPU, vram_used_mib=9200)  # NVML: 92 % -- the engine pre-reserved 9000 MiB
    engine.kv_usage = 0.10
    scraper.scrape_once()
    clock.advance(0.2)
    snap = agent.tick()
    assert snap.gpus[0].reading.vram_used_mib == 9200 - 8100  # type: ignore[union-attr]
    assert events == []
    engine.kv_usage = 0.99
    scraper.scrape_once()
    clock.advance(0.2)
    agent.tick()
    assert [e.kind for e in events] == ["watermark_pause"]
    engine.kv_usage = 0.10
    scraper.scrape_once()
    clock.advance(0.2)
    agent.tick()
    assert [e.kind for e in events][-1] == "watermark_resume"
    engine.waiting = 7  # a queue at the engine: saturated whatever the KV usage
    scraper.scrape_once()
    clock.advance(0.2)
    agent.tick()
    assert [e.kind for e in events][-1] == "watermark_pause"
    engine.waiting = 0
    scraper.scrape_once()
    clock.advance(0.2)
    agent.tick()
    assert [e.kind for e in events][-1] == "watermark_resume"
    clock.advance(5.0)  # metrics go stale: fail closed (the whole reservation counts)
    agent.tick()
    assert [e.kind for e in events][-1] == "watermark_pause"
    scraper.stop()
    agent.close()


@pytest.mark.parametrize("url", ["http://[::1", "http://h:99999", "http://a b:80", "http://:80"])
def test_an_engine_url_that_does_not_parse_is_refused_by_name(url: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_engine_spec(f"gpu={GPU},url={url}")
    assert err.value.field == "engine.url" and err.value.value == url
    ok, reason, _ = VllmControl(timeout_s=1).call("GET", f"{url}/is_sleeping")  # never raises
    assert not ok and reason.startswith(f"GET {url}/is_sleeping: ")


def test_parse_metrics_and_engine_spec() -> None:
    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="a"} 0.25\n'
        'vllm:kv_cache_usage_perc{model_name="b"} 0.5 1700000000\n'
        'vllm:num_requests_waiting{model_name="a"} 2\n'
        'vllm:num_requests_waiting{model_name="b"} 3\n'
        "vllm:num_requests_waiting_other 99\n"
        "vllm:num_requests_running 4\n"
    )
    m = parse_engine_metrics(text, endpoint="e", at_s=1.0)
    assert (m.kv_usage, m.requests_waiting, m.requests_running) == (0.5, 5, 4)
    assert parse_engine_spec("gpu=n1/0,url=http://h:8000/,reserved_mib=72000") == Engine(
        "n1/0", "http://h:8000", 72000
    )
    with pytest.raises(InvalidInput, match=r"engine\.url"):
        parse_engine_spec("gpu=n1/0,url=ftp://x")
    with pytest.raises(InvalidInput, match=r"engine\.reserved_mib"):
        parse_engine_spec("gpu=n1/0,url=http://x,reserved_mib=lots")


def test_sleep_wake_and_metrics_against_the_emulated_backend() -> None:
    from gpupool.cli.emulate import build_backend_app
    from tests.adapters.http.servers import running as serving

    app = build_backend_app("qwen2.5-0.5b", gpu="H100-SXM5-80GB", kv_budget_mib=512, speed=20.0)
    with serving(app) as url:
        clock = ManualClock()
        scraper = EngineScraper([Engine(GPU, url, reserved_mib=2000)], clock=clock)
        scraper.scrape_once()
        assert scraper.views(GPU, clock.now())[0].kv_usage == 0.0
        agent, source, events = build(clock, scraper)
        w = Workload("night-engine", GPU, "vllm-sleep", vram_mib=2000, endpoint=url, sleep_level=1)
        agent.register(w)
        sleeper = agent.pausers["vllm-sleep"]
        assert not sleeper.is_paused(w)
        source.set(GPU, vram_used_mib=9500)  # 95 %; the idle engine's 2000 MiB count as free -> 75 %
        clock.advance(0.2)
        agent.tick()
        assert events == []
        source.set(GPU, vram_used_mib=9999)
        scraper.engines = []  # no engine metrics any more: nothing is credited, 99.99 % -> pause
        clock.advance(0.2)
        agent.tick()
        agent.drain()
        assert [e.kind for e in events] == ["watermark_pause", "paused"]
        assert sleeper.is_paused(w)  # GET /is_sleeping on the emulated backend
        source.set(GPU, vram_used_mib=1000)
        clock.advance(0.2)
        agent.tick()
        agent.drain()
        assert [e.kind for e in events][-2:] == ["watermark_resume", "resumed"]
        assert not sleeper.is_paused(w)
        pauser = agent.pausers["vllm-pause"]
        wp = Workload("rl", GPU, "vllm-pause", endpoint=url)
        assert pauser.pause(wp).ok and pauser.is_paused(wp)
        assert pauser.resume(wp).ok and not pauser.is_paused(wp)
        agent.close()


def test_a_failing_vram_pauser_is_not_trusted_and_gets_revoked(engine: StandinEngine) -> None:
    clock = ManualClock()
    source = ScriptedSource.uniform("n1", 1, vram_total_mib=10000)
    pausers = {"vllm-sleep": VllmSleepPauser(control=VllmControl(timeout_s=5), clock=clock)}
    agent = NodeAgent(AgentConfig("n1", revoke_after_s=1.0), source, pausers, clock=clock)
    events: list[AgentEvent] = []
    agent.observers.append(lambda _s, evs: events.extend(evs))
    agent.register(Workload("e", GPU, "vllm-sleep", vram_mib=4000, endpoint=engine.url))
    engine.fail_sleep = True
    source.set_used_ratio(GPU, 0.95)
    for _ in range(6):
        clock.advance(0.2)
        agent.tick()
        agent.drain()
    revoke = [e for e in events if e.kind == "revoke"]
    assert len(revoke) == 1 and "last pause failed" in revoke[0].reason
    assert "gateway stops routing" in revoke[0].reason  # an engine is not killed by the agent
    agent.close()


def test_kv_metric_names_old_engines_and_absent_metric() -> None:
    """An engine that exposes only the pre-rename ``vllm:gpu_cache_usage_perc`` is read by that name;
    the current name wins when both are there; a page with neither is full (fail closed), not empty."""
    old = 'vllm:gpu_cache_usage_perc{model_name="a"} 0.3\nvllm:num_requests_waiting 1\n'
    assert parse_engine_metrics(old, endpoint="e", at_s=0.0).kv_usage == 0.3
    both = old + 'vllm:kv_cache_usage_perc{model_name="a"} 0.6\n'
    assert parse_engine_metrics(both, endpoint="e", at_s=0.0).kv_usage == 0.6
    none = "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n"
    m = parse_engine_metrics(none, endpoint="e", at_s=0.0)
    assert (m.kv_usage, m.requests_waiting, m.requests_running) == (1.0, 1, 2)


def test_sleep_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="sleep mode 'drop'"):
        VllmSleepPauser(mode="drop")
    assert VllmSleepPauser(mode="wait").mode == "wait"


def test_an_engine_that_trickles_its_answer_fails_the_call_at_the_deadline(trickle: TrickleEngine) -> None:
    # Every read brings a byte well within timeout_s: only a deadline on the whole call ends it.
    control = VllmControl(timeout_s=1.0, deadline_s=1.0)
    ok, reason, body = control.call("POST", f"{trickle.url}/sleep", level=1)
    assert (ok, body) == (False, None)
    assert reason == f"POST {trickle.url}/sleep: no complete answer within 1 s"
    assert not trickle.released.is_set()  # it was still answering
    control.close()
    with pytest.raises(ValueError, match="timeout_s=5 must be > 0 and <= deadline_s=1"):
        VllmControl(timeout_s=5, deadline_s=1)


def test_a_slow_engine_holds_one_worker_and_the_others_are_paused(
    trickle: TrickleEngine, engine: StandinEngine
) -> None:
    clock = ManualClock()
    agent, source, _ = build(clock, workers=2)
    for i in range(3):  # three leases served by the slow engine: each is probed on registration
        agent.register(Workload(f"slow-{i}", GPU, "vllm-sleep", vram_mib=1000, endpoint=trickle.url))
    agent.register(Workload("quick", GPU, "vllm-sleep", vram_mib=4000, endpoint=engine.url))
    source.set_used_ratio(GPU, 0.93)
    for _ in range(100):  # liveness bound; no drain: it would wait for the slow engine
        clock.advance(0.2)
        agent.tick()
        if agent.workloads.get("quick").state is RunState.PAUSED:  # type: ignore[union-attr]
            break
        time.sleep(0.05)
    assert engine.sleeping == 1 and agent.workloads.get("quick").state is RunState.PAUSED  # type: ignore[union-attr]
    assert trickle.requests == 1 and not trickle.released.is_set()  # one call at a time to it
    trickle.release()
    agent.drain()
    agent.close()
