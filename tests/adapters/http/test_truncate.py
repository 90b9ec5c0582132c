"""Opt-in truncation (`adapters/http/truncate.py`) by itself and through the OpenAI proxy: the oldest
turns go first, system messages and the latest turn stay, the answer says what was dropped, and a
request that did not opt in keeps the 400 ``context_length_exceeded``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.surface import configure_model
from gpupool.adapters.http.truncate import drop_oldest_turns, truncate_mode
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "truncate-token-1"
MODEL = "qwen2.5-0.5b"
CTX = 400
AUTH = {"Authorization": f"Bearer {TOK}"}


def _msgs(turns: int, chars: int = 400) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        out.append({"role": "user", "content": f"q{i} " + "x" * chars})
        out.append({"role": "assistant", "content": f"a{i} " + "y" * chars})
    out.append({"role": "user", "content": "last question"})
    return out


def test_drops_whole_turns_oldest_first_and_keeps_system_and_the_last() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "tool_calls": []},
        {"role": "tool", "content": "t1"},
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "u2"},
        {"role": "user", "content": "u3"},
    ]
    kept, n = drop_oldest_turns(msgs, lambda m: len(m) <= 3) or ([], -1)
    assert n == 2 and [m["content"] for m in kept] == ["s", "d", "u3"]  # the tool result went with its turn
    assert drop_oldest_turns(msgs, lambda m: True) == (msgs, 0)
    assert drop_oldest_turns(msgs, lambda m: len(m) <= 2) is None  # system + developer + last: 3
    assert truncate_mode(None) == "" and truncate_mode("oldest-turns") == "oldest-turns"
    with pytest.raises(ValueError, match=r"x-gpupool-truncate.*'newest'"):
        truncate_mode("newest")


@pytest.fixture
def gateway() -> Iterator[str]:
    with running(build_backend_app(MODEL, kv_budget_mib=256, speed=50.0, max_model_len=CTX)) as be_url:
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("be", MODEL, be_url, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=256))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        configure_model(app, MODEL, max_model_len=CTX)
        with running(app) as url:
            yield url


def test_truncation_through_the_proxy_is_opt_in_and_announced(gateway: str) -> None:
    body = {"model": MODEL, "messages": _msgs(5), "max_tokens": 50}
    with httpx.Client(base_url=gateway, timeout=20) as cl:
        r = cl.post("/v1/chat/completions", headers=AUTH, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = cl.post("/v1/chat/completions", headers={**AUTH, "x-gpupool-truncate": "oldest-turns"}, json=body)
        assert r.status_code == 200, r.text
        turns, tokens = (int(p.split("=")[1]) for p in r.headers["x-gpupool-truncated"].split("; "))
        assert 1 <= turns < 5 and tokens > 0
        assert r.json()["usage"]["prompt_tokens"] + 50 <= CTX  # the backend got a request that fits
        # streaming: the same header on the stream
        with cl.stream(
            "POST",
            "/v1/chat/completions",
            headers={**AUTH, "x-gpupool-truncate": "oldest-turns"},
            json={**body, "stream": True},
        ) as s:
            assert s.status_code == 200 and s.headers["x-gpupool-truncated"].startswith(f"turns={turns};")
            s.read()
        small = {"model": MODEL, "messages": _msgs(0), "max_tokens": 5}
        r = cl.post(
            "/v1/chat/completions", headers={**AUTH, "x-gpupool-truncate": "oldest-turns"}, json=small
        )
        assert r.status_code == 200 and "x-gpupool-truncated" not in r.headers  # nothing to drop
        bad = cl.post("/v1/chat/completions", headers={**AUTH, "x-gpupool-truncate": "newest"}, json=small)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-gpupool-truncate"
        huge = {"model": MODEL, "messages": [{"role": "user", "content": "z" * 4000}], "max_tokens": 5}
        r = cl.post("/v1/chat/completions", headers={**AUTH, "x-gpupool-truncate": "oldest-turns"}, json=huge)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
