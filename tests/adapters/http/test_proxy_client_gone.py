"""Clients that leave before their answer, over real HTTP: the request lease is given back and the
backend's connection is closed (so an engine such as vLLM aborts the work), on the gateway's own
server (the native proxy path) and on plain uvicorn (the ASGI path).

A backend stands in for an engine that is slow to answer: it waits before its response head (a
stream) or before its body (a complete answer) and records whether its client, the gateway, left.
Before the fix a stream whose client left before the head kept its lease until the lease's TTL
(minutes), and a complete answer kept lease and engine busy until the engine finished. Waits are
liveness bounds, not timings."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "client-gone-token-01"
MODEL = "qwen2.5-0.5b"
HOLD_S = 8.0
"""How long the backend keeps a request before it answers: far past every wait below."""


def slow_backend(left: list[str]) -> FastAPI:
    app = FastAPI()

    async def until_gone(request: Request, what: str) -> bool:
        end = time.monotonic() + HOLD_S
        while time.monotonic() < end:
            if await request.is_disconnected():
                left.append(what)
                return True
            await asyncio.sleep(0.02)
        return False

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        if body.get("stream"):
            await until_gone(request, "stream")  # no response head while it waits

            async def chunks() -> Any:
                yield b'data: {"choices": []}\n\n'
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        await until_gone(request, "complete")
        return JSONResponse({"choices": [], "usage": {"prompt_tokens": 1}})

    return app


@pytest.fixture(params=["native", "asgi"])
def stack(request: pytest.FixtureRequest) -> Iterator[tuple[str, LeaseController, list[str], str]]:
    left: list[str] = []
    with running(slow_backend(left), plain=True) as be_url:
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        with running(app, plain=request.param == "asgi") as url:
            yield url, c, left, request.param


def send_and_leave(url: str, body: dict[str, Any]) -> None:
    """Send one whole request on a raw socket, wait until the gateway holds its lease, hang up."""
    raw = json.dumps(body).encode()
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOK}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head.encode() + raw)
        time.sleep(0.3)


def wait(cond: Any, what: str, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def test_a_stream_whose_client_left_before_the_head_gives_its_lease_back(
    stack: tuple[str, LeaseController, list[str], str],
) -> None:
    url, c, left, path = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    send_and_leave(url, body)
    # native: at once (the request is cancelled); ASGI: once the head arrives and cannot be sent
    wait(lambda: c.request_lease_count() == 0, "the stream's lease given back", HOLD_S + 5)
    if path == "native":
        wait(lambda: "stream" in left, "the backend sees its client (the gateway) go")
    c.check_invariants()


@pytest.mark.parametrize("stack", ["native"], indirect=True)  # ASGI: a complete answer runs to its end
def test_a_complete_answer_whose_client_left_is_cancelled_at_the_backend(
    stack: tuple[str, LeaseController, list[str], str],
) -> None:
    url, c, left, _ = stack
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    send_and_leave(url, body)
    wait(lambda: c.request_lease_count() == 0, "the lease given back before the backend answered")
    wait(lambda: "complete" in left, "the backend sees its client (the gateway) go")
    c.check_invariants()
