"""The proxy's fast path (`ProxyFastPath`: POST on the proxy paths skips FastAPI's routing) answers
exactly as the routed app does: auth errors through the app's exception handlers, other methods and
paths through FastAPI, a completed request releases its KV lease."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.proxy import PROXY_PATHS, ProxyFastPath
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "fast-path-token-1"
MODEL = "qwen2.5-0.5b"


@pytest.fixture
def gateway() -> Iterator[tuple[str, LeaseController]]:
    with running(build_backend_app(MODEL, kv_budget_mib=64, speed=50.0)) as be_url:
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        assert any(m.cls is ProxyFastPath for m in app.user_middleware)
        with running(app) as url:
            yield url, c


def test_fast_path_auth_errors_use_the_apps_handlers(gateway: tuple[str, LeaseController]) -> None:
    url, _ = gateway
    with httpx.Client(base_url=url, timeout=20) as cl:
        for path in sorted(PROXY_PATHS):
            r = cl.post(path, json={"model": MODEL, "prompt": "x"})
            assert r.status_code == 401, (path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape, from forward()
            r = cl.post(path, json={"model": MODEL}, headers={"Authorization": "Bearer wrong-token-123"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
            assert r.json()["error"]["message"] == "Incorrect API key provided."


def test_other_methods_and_paths_still_go_through_fastapi(gateway: tuple[str, LeaseController]) -> None:
    url, _ = gateway
    auth = {"Authorization": f"Bearer {TOK}"}
    with httpx.Client(base_url=url, timeout=20) as cl:
        assert cl.get("/v1/completions", headers=auth).status_code == 405
        assert cl.post("/v1/completions/", headers=auth, json={}).status_code in (307, 404, 405)
        assert cl.get("/v1/models", headers=auth).json()["data"][0]["id"] == MODEL


def test_fast_path_answers_and_releases_the_request_lease(gateway: tuple[str, LeaseController]) -> None:
    url, c = gateway
    auth = {"Authorization": f"Bearer {TOK}"}
    with httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post("/v1/completions", headers=auth, json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.headers["x-gpupool-backend"] == "be" and r.headers["x-gpupool-lease"]
        bad = cl.post("/v1/completions", headers=auth, content=b"{not json")
        assert bad.status_code == 400
        assert c.request_lease_count() == 0  # the request lease was released before the answer


def test_fast_path_reads_a_chunked_body_and_answers_with_exact_headers(
    gateway: tuple[str, LeaseController],
) -> None:
    """A body sent in several chunks is joined whole; the answer's Content-Length is the body's
    length, the backend's JSON content type passes through, the lease id is a UUID4."""
    url, c = gateway
    auth = {"Authorization": f"Bearer {TOK}", "content-type": "application/json"}
    doc = json.dumps({"model": MODEL, "prompt": "hi there", "max_tokens": 2}).encode()

    def parts() -> Iterator[bytes]:
        for i in range(0, len(doc), 7):
            yield doc[i : i + 7]

    with httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post("/v1/completions", headers=auth, content=parts())
        assert r.status_code == 200, r.text
        assert r.request.headers.get("transfer-encoding") == "chunked"
        assert int(r.headers["content-length"]) == len(r.content)
        assert r.headers["content-type"] == "application/json"
        lease = uuid.UUID(r.headers["x-gpupool-lease"])
        assert lease.version == 4 and str(lease) == r.headers["x-gpupool-lease"]
        assert r.json()["object"] == "text_completion"
    assert c.request_lease_count() == 0


def test_fast_path_repeated_authorization_first_value_wins(gateway: tuple[str, LeaseController]) -> None:
    """As with Starlette's ``Headers.get``: of two Authorization headers the first one counts."""
    url, _ = gateway
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    good, bad = ("Authorization", f"Bearer {TOK}"), ("Authorization", "Bearer wrong-token-123")
    with httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post("/v1/completions", headers=[good, bad], json=body)
        assert r.status_code == 200, r.text
        r = cl.post("/v1/completions", headers=[bad, good], json=body)
        assert r.status_code == 401, r.text


async def _text_backend(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A backend answering ``text/plain`` without a charset (and its model list)."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    head = [(b"content-type", b"text/plain"), (b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": b"plain"})


def test_fast_path_text_answer_gets_a_charset_like_starlette_would_add() -> None:
    with running(_text_backend) as be_url:
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
            r = cl.post(
                "/v1/completions",
                headers={"Authorization": f"Bearer {TOK}"},
                json={"model": MODEL, "prompt": "hi", "max_tokens": 1},
            )
            assert r.status_code == 200 and r.content == b"plain"
            assert r.headers["content-type"] == "text/plain; charset=utf-8"
            assert r.headers["content-length"] == "5" and r.headers["x-gpupool-backend"] == "be"
        assert c.request_lease_count() == 0
