"""The proxy's native path (`native.NativeProxy`: POSTs on the proxy paths answered by the gateway's
own HTTP protocol, below ASGI) answers exactly as the ASGI path does, over real sockets: same
statuses, error bodies and headers; the proxy body limit (declared and chunked); streams whose client
goes away release their lease; pipelined requests are answered in order; keep-alive and
``Connection: close`` are honoured; the path is really taken (the ASGI middleware never sees it)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "native-path-token-1"
MODEL = "qwen2.5-0.5b"
LIMIT = 4096
AUTH = {"Authorization": f"Bearer {TOK}"}


def _gateway(be_url: str) -> tuple[Any, LeaseController]:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
    app = create_app(
        c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer(), max_proxy_body_bytes=LIMIT
    )
    return app, c


@pytest.fixture
def two() -> Iterator[dict[str, tuple[str, LeaseController, list[str]]]]:
    """The same gateway twice over one backend: served natively, and by plain uvicorn (all ASGI).
    Each comes with the list of paths its ASGI stack saw (a pure ASGI wrapper records them)."""
    with running(build_backend_app(MODEL, kv_budget_mib=64, speed=200.0)) as be_url:
        out = {}
        stack = []
        for name, plain in (("native", False), ("asgi", True)):
            app, c = _gateway(be_url)
            seen: list[str] = []
            app.add_middleware(_Recorder, seen=seen)
            cm = running(app, plain=plain)
            stack.append(cm)
            out[name] = (cm.__enter__(), c, seen)
        try:
            yield out
        finally:
            for cm in reversed(stack):
                cm.__exit__(None, None, None)


class _Recorder:
    def __init__(self, app: Any, *, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


CASES: list[tuple[str, dict[str, str], bytes]] = [
    ("/v1/completions", AUTH, json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()),
    ("/v1/completions", {}, json.dumps({"model": MODEL, "prompt": "hi"}).encode()),
    ("/v1/completions", {"Authorization": "Bearer wrong-token-1"}, b"{}"),
    ("/v1/completions", AUTH, b"{not json"),
    ("/v1/completions", AUTH, b"[1, 2]"),
    ("/v1/chat/completions", AUTH, json.dumps({"model": "no-such-model", "messages": []}).encode()),
    ("/v1/chat/completions", AUTH, json.dumps({"model": MODEL, "messages": "x"}).encode()),
    ("/v1/embeddings", AUTH, json.dumps({"model": MODEL, "input": "x"}).encode()),
    ("/v1/completions", AUTH, b'{"model": "' + b"x" * LIMIT + b'"}'),
    ("/v1/completions?x=1", AUTH, json.dumps({"model": MODEL, "prompt": "q", "max_tokens": 1}).encode()),
]


def _answer(r: httpx.Response) -> tuple[int, str, Any, str]:
    try:
        body: Any = r.json()
    except ValueError:
        body = r.text
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in ("id", "created")}
    return r.status_code, r.headers.get("content-type", ""), body, r.headers.get("www-authenticate", "")


def test_native_answers_as_the_asgi_path_does(two: dict[str, tuple[str, LeaseController, list[str]]]) -> None:
    got: dict[str, list[Any]] = {}
    for name, (url, c, _) in two.items():
        with httpx.Client(base_url=url, timeout=30) as cl:
            got[name] = [
                _answer(cl.post(p, content=b, headers={**h, "content-type": "application/json"}))
                for p, h, b in CASES
            ]
        assert c.request_lease_count() == 0
    for case, a, b in zip(CASES, got["native"], got["asgi"], strict=True):
        assert a == b, case[0]
    statuses = [a[0] for a in got["native"]]
    assert statuses == [200, 401, 401, 400, 400, 404, 400, 400, 413, 200]
    # the native server's ASGI stack never saw a proxy POST; the plain one saw every one
    assert not [p for p in two["native"][2] if p.startswith("/v1/")]
    assert len([p for p in two["asgi"][2] if p.startswith("/v1/")]) == len(CASES)


def _raw(url: str, data: bytes, *, read_until_close: bool = True, timeout_s: float = 20) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
            if not read_until_close and out.count(b"HTTP/1.1 ") >= 2 and out.endswith(b"}"):
                break
        return out


def _post(path: str, body: bytes, *, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOK}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def test_declared_and_chunked_bodies_over_the_limit_are_413_and_close(
    two: dict[str, tuple[str, LeaseController, list[str]]],
) -> None:
    url, c, _ = two["native"]
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOK}\r\n"
    # declared: answered from the head alone (the body is never sent), then the connection closes
    out = _raw(url, (head + f"Content-Length: {LIMIT + 1}\r\n\r\n").encode())
    assert out.startswith(b"HTTP/1.1 413 ") and b"connection: close" in out.lower()
    assert b'"body_too_large"' in out
    # chunked: cut off once past the limit
    chunk = b"x" * 1024
    body = b"".join(b"%x\r\n%b\r\n" % (len(chunk), chunk) for _ in range(LIMIT // 1024 + 2))
    out = _raw(url, (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + body + b"0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413 ") and b'"body_too_large"' in out
    assert c.request_lease_count() == 0


def test_pipelined_requests_are_answered_in_order(
    two: dict[str, tuple[str, LeaseController, list[str]]],
) -> None:
    url, c, _ = two["native"]
    ok = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 1}).encode()
    bad = json.dumps({"model": "nope", "prompt": "p"}).encode()
    out = _raw(
        url, _post("/v1/completions", ok) + _post("/v1/completions", bad), read_until_close=False, timeout_s=5
    )
    first, second = out.index(b"HTTP/1.1 200 "), out.index(b"HTTP/1.1 404 ")
    assert first < second
    assert c.request_lease_count() == 0


def test_keep_alive_and_connection_close(two: dict[str, tuple[str, LeaseController, list[str]]]) -> None:
    url, _, _ = two["native"]
    ok = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 1}).encode()
    out = _raw(url, _post("/v1/completions", ok, extra="Connection: close\r\n"))
    assert out.startswith(b"HTTP/1.1 200 ") and b"connection: close" in out.lower()  # and it closed
    with httpx.Client(base_url=url, timeout=20) as cl:
        for _ in range(5):
            r = cl.post("/v1/completions", content=ok, headers={**AUTH, "content-type": "application/json"})
            assert r.status_code == 200 and r.headers.get("connection") != "close"


def test_a_stream_whose_client_goes_away_releases_its_lease(
    two: dict[str, tuple[str, LeaseController, list[str]]],
) -> None:
    url, c, _ = two["native"]
    body = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 4000, "stream": True}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(_post("/v1/completions", body))
        got = b""
        while b"data:" not in got:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in got.lower()
        assert c.request_lease_count() == 1
    deadline = time.monotonic() + 20
    while c.request_lease_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.request_lease_count() == 0


def test_streams_are_identical_on_both_paths(two: dict[str, tuple[str, LeaseController, list[str]]]) -> None:
    texts = {}
    for name, (url, c, _) in two.items():
        with httpx.Client(base_url=url, timeout=30) as cl:
            body = {"model": MODEL, "prompt": "p", "max_tokens": 5, "stream": True}
            with cl.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
                assert r.status_code == 200
                ctype = r.headers["content-type"]
                events = [ln for ln in r.iter_lines() if ln.startswith("data:")]
        texts[name] = (
            ctype,
            [json.loads(e[5:])["choices"][0]["text"] if e != "data: [DONE]" else e for e in events],
        )
        assert c.request_lease_count() == 0
    assert texts["native"] == texts["asgi"]
    assert texts["native"][1][-1] == "data: [DONE]"


def _dying_backend() -> Any:
    """Streams one event, then fails: uvicorn drops the connection mid-body (a backend that died)."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> Any:
        async def chunks() -> Any:
            yield b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
            raise RuntimeError("the engine died")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


@pytest.mark.parametrize("plain", [False, True], ids=["native", "asgi"])
def test_a_stream_the_backend_cuts_short_ends_the_client_connection(plain: bool) -> None:
    """The backend dies mid-stream: the client's connection is closed at once (an unterminated
    chunked body, as uvicorn's ASGI cycle does), never left open looking like a stream that is
    merely slow until the keep-alive timer (here an hour) closes it; the lease is given back."""
    with running(_dying_backend(), plain=True) as be_url:
        app, c = _gateway(be_url)
        options = {} if plain else {"keep_alive_s": 3600}
        with running(app, plain=plain, **options) as url:
            body = json.dumps({"model": MODEL, "prompt": "p", "max_tokens": 4, "stream": True}).encode()
            host, port = url.removeprefix("http://").split(":")
            out = b""
            with socket.create_connection((host, int(port)), timeout=20) as s:
                s.sendall(_post("/v1/completions", body))
                while chunk := s.recv(65536):  # a TimeoutError here: the connection was left open
                    out += chunk
            assert out.startswith(b"HTTP/1.1 200 ") and b'"text": "a"' in out
            assert not out.endswith(b"0\r\n\r\n")  # the cut is not passed off as the stream's end
            assert c.request_lease_count() == 0
