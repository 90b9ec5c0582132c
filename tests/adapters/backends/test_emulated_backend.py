"""The emulated backend over real HTTP: OpenAI shapes, streaming, KV books, vLLM metrics and the
sleep / pause endpoints the node agent drives."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from gpupool.adapters.backends import EmulatedEngine, Roofline
from gpupool.adapters.backends.app import create_backend_app, render_metrics
from gpupool.adapters.backends.engine import Sequence
from gpupool.cli.emulate import build_backend_app, build_engine
from tests.adapters.http.servers import running


def test_roofline_numbers_by_hand() -> None:
    # 7e9 params bf16 on an A100 (2039 GB/s, 312 TFLOP/s), batch 1, empty KV:
    # memory term 14e9 / (2039e9 * 0.7) = 9.81 ms; compute term 14e9 / (312e12 * 0.5) = 0.09 ms.
    r = Roofline(
        params=7_000_000_000,
        bytes_per_param=2,
        kv_bytes_per_token=57344,
        mem_bw_bytes_s=2039e9,
        peak_flops=312e12,
    )
    assert r.decode_step_s(1, 0) == pytest.approx(14e9 / (2039e9 * 0.7))
    assert r.prefill_s(1000) == pytest.approx(2 * 7e9 * 1000 / (312e12 * 0.5))
    half = Roofline(
        params=7_000_000_000,
        bytes_per_param=2,
        kv_bytes_per_token=57344,
        mem_bw_bytes_s=2039e9,
        peak_flops=312e12,
        compute_fraction=0.5,
    )
    assert half.decode_step_s(1, 0) == pytest.approx(2 * r.decode_step_s(1, 0))


def test_engine_books_blocks_and_preempts_under_pressure() -> None:
    async def go() -> EmulatedEngine:
        roof = Roofline(
            params=10**8,
            bytes_per_param=2,
            kv_bytes_per_token=1024 * 1024,
            mem_bw_bytes_s=1e12,
            peak_flops=1e14,
        )
        eng = EmulatedEngine(roof, kv_budget_mib=16 * 8, block_size=16, speed=100)  # 8 blocks of 16 tokens
        eng.start()
        seqs = [eng.submit(40, 40, priority=p) for p in (1, 0)]  # each needs 4 -> 5 blocks
        await _drain(eng, seqs, done)
        await eng.stop()
        return eng

    done: list[int] = []
    eng = asyncio.run(go())
    assert eng.num_blocks == 8 and eng.used_blocks == 0 and eng.generation_tokens_total == 80
    assert eng.ttft_counts and sum(eng.ttft_counts) >= 2
    # both outgrow 4 blocks at once: the less urgent one (vLLM priority 1, submitted first) is
    # preempted and recomputed, so the urgent one finishes first
    assert eng.preemptions >= 1
    assert done == [1, 0]


async def _drain(eng: EmulatedEngine, seqs: list[Sequence], done: list[int]) -> None:
    """Read every sequence's tokens concurrently; append each one's index to ``done`` as it ends."""

    async def one(i: int, s: Sequence) -> None:
        while await s.out.get() is not None:
            eng.check()
        done.append(i)

    await asyncio.gather(*(one(i, s) for i, s in enumerate(seqs)))


def test_engine_preempts_the_youngest_of_equal_priority() -> None:
    # Same books as above, equal priorities: the most recently arrived sequence is the victim
    # (vLLM's recompute preemption), so the first one submitted finishes first.
    async def go() -> EmulatedEngine:
        roof = Roofline(
            params=10**8,
            bytes_per_param=2,
            kv_bytes_per_token=1024 * 1024,
            mem_bw_bytes_s=1e12,
            peak_flops=1e14,
        )
        eng = EmulatedEngine(roof, kv_budget_mib=16 * 8, block_size=16, speed=100)
        eng.start()
        seqs = [eng.submit(40, 40, priority=0) for _ in range(2)]
        await _drain(eng, seqs, done)
        await eng.stop()
        return eng

    done: list[int] = []
    eng = asyncio.run(go())
    assert eng.preemptions >= 1 and eng.generation_tokens_total == 80
    assert done == [0, 1]


def test_openai_routes_stream_metrics_and_sleep() -> None:
    app = build_backend_app("qwen2.5-0.5b", gpu="H100-SXM5-80GB", kv_budget_mib=512, speed=20.0)
    with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
        assert cl.get("/v1/models").json()["data"][0]["id"] == "qwen2.5-0.5b"
        r = cl.post(
            "/v1/completions", json={"model": "qwen2.5-0.5b", "prompt": "hello world", "max_tokens": 5}
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        chat = cl.post(
            "/v1/chat/completions",
            json={"model": "qwen2.5-0.5b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert chat.json()["choices"][0]["message"]["content"] == " tok1 tok2 tok3"
        chunks = []
        with cl.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "qwen2.5-0.5b",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 4,
                "stream": True,
            },
        ) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
        assert chunks[-1] == "[DONE]" and len(chunks) == 6
        assert json.loads(chunks[0])["choices"][0]["delta"]["role"] == "assistant"
        assert json.loads(chunks[1])["choices"][0]["delta"]["content"] == " tok1"
        emb = cl.post("/v1/embeddings", json={"model": "qwen2.5-0.5b", "input": ["a", "b"]})
        assert emb.status_code == 400 and emb.json()["error"]["param"] == "model"  # a generate model
        assert cl.post("/v1/completions", json={"model": "other", "prompt": "x"}).status_code == 404
        text = cl.get("/metrics").text
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:cache_config_info",
        ):
            assert name in text
        # sleep / wake / pause / resume, as vLLM exposes them
        assert cl.get("/is_sleeping").json() == {"is_sleeping": False}
        assert cl.post("/sleep", params={"level": 3}).status_code == 400
        assert cl.post("/sleep", params={"level": 1}).status_code == 200
        assert cl.get("/is_sleeping").json() == {"is_sleeping": True}
        result: dict[str, int] = {}

        def slow() -> None:
            with httpx.Client(base_url=url, timeout=20) as c2:
                result["n"] = c2.post(
                    "/v1/completions", json={"model": "qwen2.5-0.5b", "prompt": "z", "max_tokens": 2}
                ).json()["usage"]["completion_tokens"]

        t = threading.Thread(target=slow)
        t.start()
        waiting = 'vllm:num_requests_waiting{model_name="qwen2.5-0.5b"} 1'
        deadline = time.monotonic() + 10
        while waiting not in cl.get("/metrics").text:  # bounded poll: the request reaches the engine
            assert time.monotonic() < deadline, "the request never showed as waiting"
            time.sleep(0.02)
        assert "n" not in result and t.is_alive()  # asleep: it waits, unanswered
        assert cl.post("/wake_up").status_code == 200
        t.join(10)
        assert result["n"] == 2
        assert cl.post("/pause").status_code == 200 and cl.get("/is_paused").json() == {"is_paused": True}
        assert cl.post("/resume").status_code == 200 and cl.get("/is_paused").json() == {"is_paused": False}


def test_metrics_text_parses_as_prometheus() -> None:
    eng = build_engine("qwen2.5-0.5b", kv_budget_mib=64)
    assert isinstance(eng, EmulatedEngine)
    text = render_metrics(eng, "m")
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds",
    } <= names
    assert create_backend_app(eng, model="m") is not None
