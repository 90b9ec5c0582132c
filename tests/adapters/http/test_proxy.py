"""The OpenAI-compatible proxy over real HTTP: gateway -> emulated backend, request leases sized by
the KV estimator, released on completion and on client disconnect, priority forwarded inverted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.surface import configure_backend
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "proxy-tenant-token-1"
MODEL = "qwen2.5-0.5b"


@pytest.fixture
def stack() -> Iterator[tuple[str, LeaseController, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    echo = FastAPI()

    @echo.post("/v1/completions")
    async def capture(request: Request) -> dict[str, Any]:
        seen.append({"body": await request.json(), "lease": request.headers.get("x-gpupool-lease")})
        return {"ok": True}

    with running(build_backend_app(MODEL, kv_budget_mib=64, speed=50.0)) as be_url, running(echo) as echo_url:
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
        c.register_backend(
            Backend("echo", "echo-model", echo_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=1024)
        )
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        configure_backend(app, "echo", priority_scheduling=True)
        with running(app) as url:
            yield url, c, seen


def h(prio: str = "P0") -> dict[str, str]:
    return {"Authorization": f"Bearer {TOK}", "x-gpupool-priority": prio}


def test_completion_stream_and_release(stack: tuple[str, LeaseController, list[dict[str, Any]]]) -> None:
    url, c, _ = stack
    with httpx.Client(base_url=url, timeout=20) as cl:
        assert cl.get("/v1/models", headers=h()).json()["data"][0]["id"] in (MODEL, "echo-model")
        r = cl.post("/v1/completions", headers=h(), json={"model": MODEL, "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert r.headers["x-gpupool-backend"] == "be"
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 4,
            "stream": True,
        }
        with cl.stream("POST", "/v1/chat/completions", headers=h(), json=chat) as s:
            lines = [x for x in s.iter_lines() if x.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and len(lines) == 6  # role chunk + 4 tokens + [DONE]
        emb = cl.post("/v1/embeddings", headers=h("P1"), json={"model": MODEL, "input": "abc"})
        assert emb.status_code == 400 and emb.json()["error"]["param"] == "model"  # a chat model
    assert c.request_lease_count() == 0
    c.check_invariants()


def test_client_disconnect_releases_the_request_lease(
    stack: tuple[str, LeaseController, list[dict[str, Any]]],
) -> None:
    url, c, _ = stack
    body = {"model": MODEL, "prompt": "long", "max_tokens": 5000, "stream": True}
    with (
        httpx.Client(base_url=url, timeout=20) as cl,
        cl.stream("POST", "/v1/completions", headers=h(), json=body) as s,
    ):
        it = s.iter_lines()
        next(it)
        assert c.request_lease_count() == 1
    deadline = time.monotonic() + 5
    while c.request_lease_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert c.request_lease_count() == 0


def test_priority_is_forwarded_inverted_and_errors(
    stack: tuple[str, LeaseController, list[dict[str, Any]]],
) -> None:
    url, _, seen = stack
    with httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post(
            "/v1/completions",
            headers={**h(), "x-gpupool-priority": "P0"},
            json={"model": "echo-model", "prompt": "x"},
        )
        assert r.status_code == 200 and seen[-1]["body"]["priority"] == -100 and seen[-1]["lease"]
        cl.post(
            "/v1/completions",
            headers={"Authorization": f"Bearer {TOK}", "x-gateway-inference-objective": "batch"},
            json={"model": "echo-model", "prompt": "x"},
        )
        assert seen[-1]["body"]["priority"] == 1
        assert cl.post("/v1/completions", json={"model": MODEL}).status_code == 401
        assert cl.post("/v1/completions", headers=h(), json={"model": "nope"}).status_code == 404
        assert cl.post("/v1/completions", headers=h(), content=b"[1,2]").status_code == 400
        assert cl.post("/v1/completions", headers=h("urgent!"), json={"model": MODEL}).status_code == 400
        # a context far larger than the KV budget (64 MiB ~ 5k tokens of 12 KiB) can never be served:
        # the client's to change (400 naming the field), not a 503 an SDK would retry
        big = cl.post(
            "/v1/completions", headers=h(), json={"model": MODEL, "prompt": "x", "max_tokens": 20_000}
        )
        assert big.status_code == 400 and big.json()["error"]["code"] == "kv_budget_exceeded", big.text
        assert big.json()["error"]["param"] == "max_tokens"
