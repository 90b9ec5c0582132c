"""Property: no body sent to the OpenAI routes of a gateway with real (emulated) backends behind it is
answered 5xx, every 4xx is in OpenAI's error shape, and every request lease is released. The schema
fuzz (`test_fuzz.py`) runs without backends, so it never gets past "model not found"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.surface import configure_model
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.emulate import build_backend_app
from gpupool.cli.serve import KvSizer
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.ports import Backend
from tests.adapters.http.servers import running

TOK = "openai-fuzz-tenant-token"
CHAT, EMBED = "qwen2.5-0.5b", "bge-base-en-v1.5"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=6,
)
messages = st.one_of(
    values,
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system", "assistant"]),
                "content": st.one_of(st.text(max_size=40), values),
            }
        ),
        max_size=3,
    ),
)
prompt = st.one_of(
    values,
    st.text(max_size=40),
    st.lists(st.text(max_size=10), max_size=3),
    st.lists(st.integers(0, 9), max_size=4),
)
small = st.one_of(values, st.integers(-2, 6))
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from([CHAT, EMBED, "missing-model"])},
    optional={
        "messages": messages,
        "prompt": prompt,
        "input": prompt,
        "n": small,
        "max_tokens": st.one_of(small, st.integers(1, 70_000)),
        "stop": st.one_of(values, st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3)),
        "stream": st.one_of(st.booleans(), values),
        "stream_options": st.one_of(values, st.just({"include_usage": True})),
        "encoding_format": st.one_of(st.sampled_from(["float", "base64", "hex"]), values),
        "dimensions": small,
        "priority": small,
    },
)
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, LeaseController]]:
    with (
        running(build_backend_app(CHAT, kv_budget_mib=256, speed=200.0, max_model_len=512)) as chat,
        running(build_backend_app(EMBED, kv_budget_mib=64, speed=200.0)) as emb,
    ):
        c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
        c.register_backend(Backend("chat", CHAT, chat, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=256))
        c.register_backend(Backend("emb", EMBED, emb, node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=64))
        app = create_app(c, tokens=TokenTable([(TOK, "t", "tenant")]), sizer=KvSizer())
        configure_model(app, CHAT, max_model_len=512)
        with running(app) as url:
            yield url, c


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_no_body_is_a_5xx(gateway: tuple[str, LeaseController], route: str, body: dict[str, Any]) -> None:
    url, c = gateway
    with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {TOK}"}) as cl:
        r = cl.post(route, json=body)
        text = r.read()
    assert r.status_code < 500, (route, body, text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    deadline = time.monotonic() + 5
    while c.request_lease_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.request_lease_count() == 0
