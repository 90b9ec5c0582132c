"""The emulated backend's OpenAI / vLLM surface over real HTTP: ``/tokenize`` in vLLM's shape,
``--scheduling-policy`` (fcfs rejects non-zero priorities as vLLM does), context limits, streamed
``n`` choices each with a role and a finish reason, and deep JSON answered 400."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from gpupool.adapters.backends.tokenizer import EmulatedTokenizer
from gpupool.cli.emulate import build_backend_app
from tests.adapters.http.servers import running

MODEL = "qwen2.5-0.5b"


def test_tokenize_matches_usage_and_vllm_shape() -> None:
    app = build_backend_app(MODEL, kv_budget_mib=256, speed=100.0, max_model_len=64)
    with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
        t = cl.post("/tokenize", json={"model": MODEL, "prompt": "hello 12 世界"}).json()
        assert set(t) == {"count", "max_model_len", "tokens", "token_strs"} and t["max_model_len"] == 64
        assert (
            t["count"] == len(t["tokens"]) == 1 + 1 + 2 + 2
        )  # BOS, "hello", "1", "2", "世", "界" (lone spaces join)
        msgs = [{"role": "user", "content": "hi"}]
        chat_count = cl.post("/tokenize", json={"model": MODEL, "messages": msgs}).json()["count"]
        r = cl.post("/v1/chat/completions", json={"model": MODEL, "messages": msgs, "max_tokens": 1}).json()
        assert r["usage"]["prompt_tokens"] == chat_count == len(EmulatedTokenizer().encode_chat(msgs))
        assert cl.get("/v1/models").json()["data"][0]["max_model_len"] == 64
        over = cl.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 64})
        assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"
        deep = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        assert cl.post("/v1/completions", content=deep).status_code == 400
        assert cl.post("/tokenize", content=deep).status_code == 400


def test_scheduling_policy_fcfs_rejects_priority_like_vllm() -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "priority": -100}
    with running(build_backend_app(MODEL, kv_budget_mib=64, speed=100.0)) as url:
        r = httpx.post(url + "/v1/completions", json=body, timeout=20)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
        assert (
            httpx.post(url + "/v1/completions", json={**body, "priority": 0}, timeout=20).status_code == 200
        )
    app = build_backend_app(MODEL, kv_budget_mib=64, speed=100.0, scheduling_policy="priority")
    with running(app) as url:
        assert httpx.post(url + "/v1/completions", json=body, timeout=20).status_code == 200


def test_streamed_n_choices_each_have_role_and_finish_reason() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        running(build_backend_app(MODEL, kv_budget_mib=64, speed=100.0)) as url,
        httpx.Client(base_url=url, timeout=20) as cl,
        cl.stream("POST", "/v1/chat/completions", json=body) as s,
    ):
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: {")]
    roles = {c["index"] for e in events for c in e["choices"] if c["delta"].get("role") == "assistant"}
    finals = {c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]}
    assert roles == {0, 1} and finals == {0: "length", 1: "length"}
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6
    assert all(e["usage"] is None for e in events[:-1])


def _running_requests(cl: httpx.Client) -> float:
    line = next(x for x in cl.get("/metrics").text.splitlines() if x.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


def test_a_client_that_hangs_up_before_a_whole_answer_is_aborted_like_vllm() -> None:
    # (vLLM cancels a non-streamed request whose client disconnected; it must not keep generating,
    # holding KV blocks and a running slot, for nobody)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 30000}
    app = build_backend_app(MODEL, kv_budget_mib=1024, speed=0.05)
    with running(app, plain=True) as url, httpx.Client(base_url=url, timeout=20) as cl:
        for _ in range(3):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(url + "/v1/chat/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 15  # the answers themselves would take minutes
        while _running_requests(cl) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _running_requests(cl) == 0
        done = cl.post("/v1/chat/completions", json={**body, "max_tokens": 2})  # and it still serves
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2
