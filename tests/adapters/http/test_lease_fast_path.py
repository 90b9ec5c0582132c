"""The lease API's fast path (`leasefast.LeaseFastPath`) answers exactly as the FastAPI routes do.

Two gateways over equal controllers (same pool, clock and seeded ids), one with the fast path and
one without it, each behind a real uvicorn server, get the same requests in the same order: every
answer (status, JSON body, the headers a client reads) must be equal. A counting layer right under
the fast path shows which requests it answered itself (the certain ones) and which it handed on to
FastAPI (every other case), so the comparison covers both ways in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.middleware import Middleware

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.leasefast import LeaseFastPath
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import ManualClock
from gpupool.core.controller import LeaseController
from gpupool.core.ids import seeded_lease_ids
from tests.adapters.http.servers import running

TOK, OTHER, ADMIN = "lease-fast-token-1", "lease-fast-token-2", "lease-fast-admin-1"
HEADERS_COMPARED = ("content-type", "content-length", "www-authenticate", "retry-after", "location")


class Reached:
    """ASGI layer under the fast path: records the requests that got past it."""

    def __init__(self, app: Any, *, log: list[str]) -> None:
        self.app, self.log = app, log

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.log.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


def _gateway(*, fast: bool, log: list[str]) -> Any:
    c = LeaseController(
        seed_example_pool(),
        clock=ManualClock(1_000_000.0),
        store=MemoryLeaseStore(),
        lease_ids=seeded_lease_ids(7),
        ticket_ids=seeded_lease_ids(8),
    )
    tokens = TokenTable([(TOK, "t", "tenant"), (OTHER, "u", "tenant"), (ADMIN, "ops", "admin")])
    app = create_app(c, tokens=tokens, proxy=False)
    at = next(i for i, m in enumerate(app.user_middleware) if m.cls is LeaseFastPath)
    if fast:
        app.user_middleware.insert(at + 1, Middleware(Reached, log=log))  # type: ignore[arg-type]
    else:
        app.user_middleware[at] = Middleware(Reached, log=log)  # type: ignore[arg-type]
    return app


@pytest.fixture
def pair() -> Iterator[tuple[httpx.Client, httpx.Client, list[str]]]:
    reached: list[str] = []
    with (
        running(_gateway(fast=True, log=reached)) as fast_url,
        running(_gateway(fast=False, log=[])) as routed_url,
        httpx.Client(base_url=fast_url, timeout=20) as fast,
        httpx.Client(base_url=routed_url, timeout=20) as routed,
    ):
        yield fast, routed, reached


def _same(fast: httpx.Client, routed: httpx.Client, method: str, path: str, **kw: Any) -> httpx.Response:
    a = fast.request(method, path, **kw)
    b = routed.request(method, path, **kw)
    where = f"{method} {path} {kw}"
    assert a.status_code == b.status_code, (where, a.text, b.text)
    assert a.content == b.content or a.json() == b.json(), (where, a.text, b.text)
    for h in HEADERS_COMPARED:
        x, y = a.headers.get(h), b.headers.get(h)
        if h == "location" and x and y:  # (a redirect names its own server)
            x, y = httpx.URL(x).path, httpx.URL(y).path
        assert x == y, (where, h)
    return a


def auth(token: str = TOK, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


GOOD = {"priority": "P1", "vram_mib": 1024, "ttl_s": 60}
JSON = {"content-type": "application/json"}


def test_certain_requests_are_answered_by_the_fast_path_exactly(
    pair: tuple[httpx.Client, httpx.Client, list[str]],
) -> None:
    fast, routed, reached = pair
    body = json.dumps(GOOD).encode()
    ids = []
    for path in ("/v1/leases", "/v1/noop"):
        for headers in (
            {**auth(), **JSON},
            {**auth(scheme="bearer"), "content-type": "Application/JSON; charset=utf-8"},
            {**auth(ADMIN), **JSON},
        ):
            r = _same(fast, routed, "POST", path, headers=headers, content=body)
            assert r.status_code == 201, r.text
            ids.append((path, r.json()["id"]))
    r = _same(fast, routed, "POST", "/v1/leases?ignored=1", headers={**auth(), **JSON}, content=body)
    ids.append(("/v1/leases", r.json()["id"]))
    for path, lid in ids:
        r = _same(fast, routed, "DELETE", f"{path}/{lid}", headers=auth(ADMIN))
        assert r.status_code == 200, r.text
    r = _same(fast, routed, "DELETE", f"/v1/leases/{ids[0][1]}", headers=auth())  # again: idempotent
    assert r.json()["state"] == "released"
    assert reached == [], "every request above was certain: none should reach FastAPI"


def test_every_other_case_is_handed_to_fastapi_and_answered_as_before(
    pair: tuple[httpx.Client, httpx.Client, list[str]],
) -> None:
    fast, routed, reached = pair
    body = json.dumps(GOOD).encode()
    handed = [
        ({**JSON}, body),  # no token
        ({**auth("not-a-token-at-all"), **JSON}, body),
        ({**auth(scheme="Basic"), **JSON}, body),
        ({"Authorization": "Bearer", **JSON}, body),
        ({**auth(), "content-type": "text/plain"}, body),
        ({**auth(), "content-type": "application/merge-patch+json"}, body),
        (auth(), body),  # no content type
        ({**auth(), **JSON, "content-encoding": "gzip"}, body),
        ({**auth(), **JSON, "content-encoding": "identity"}, body),
        ({**auth(), **JSON}, b""),
        ({**auth(), **JSON}, b"{not json"),
        ({**auth(), **JSON}, b'{"vram_mib": 1, "vram_mib": 2}'),
        ({**auth(), **JSON}, b"[1, 2]"),
        ({**auth(), **JSON}, b"\xff\xfe"),
        ({**auth(), **JSON}, b"[" * 200 + b"]" * 200),
        ({**auth(), **JSON}, json.dumps({**GOOD, "vram_mib": -1}).encode()),
        ({**auth(), **JSON}, json.dumps({**GOOD, "unknown_field": 1}).encode()),
    ]
    for path in ("/v1/leases", "/v1/noop"):
        for headers, content in handed:
            before = len(reached)
            r = _same(fast, routed, "POST", path, headers=headers, content=content)
            assert len(reached) == before + 1, (path, headers, content, r.text)
    for method, path in (
        ("DELETE", "/v1/leases/x/y"),
        ("DELETE", "/v1/leases/"),
        ("POST", "/v1/leases/"),
        ("GET", "/v1/leases"),
        ("DELETE", "/v1/noop/"),
    ):
        before = len(reached)
        _same(fast, routed, method, path, headers=auth(), follow_redirects=False)
        assert len(reached) == before + 1, (method, path)
    for headers in ({}, auth("not-a-token-at-all")):
        before = len(reached)
        r = _same(fast, routed, "DELETE", "/v1/leases/some-id", headers=headers)
        assert r.status_code == 401 and len(reached) == before + 1


def test_errors_raised_by_the_handlers_take_the_apps_exception_handlers(
    pair: tuple[httpx.Client, httpx.Client, list[str]],
) -> None:
    """Certain requests that the handler refuses: the same status, body and headers as the route's
    (InvalidInput 422, a tenant's reserved label 403, UnknownId 404, no capacity 429/503)."""
    fast, routed, reached = pair
    refused = [
        ({"priority": "P1"}, 422),  # neither vram_mib nor model (InvalidInput from the handler)
        ({**GOOD, "labels": {"gpupool.io/pauser": "x"}}, 403),
        ({**GOOD, "priority": "P9"}, 422),
        ({**GOOD, "compute_pct": 10, "compute_milli": 100}, 422),
        ({**GOOD, "vram_mib": 10_000_000}, 503),
        ({**GOOD, "nodes": ["no-such-node"]}, None),
    ]
    for doc, status in refused:
        r = _same(fast, routed, "POST", "/v1/leases", headers={**auth(), **JSON}, content=json.dumps(doc))
        assert status is None or r.status_code == status, (doc, r.text)
    mine = _same(fast, routed, "POST", "/v1/leases", headers={**auth(), **JSON}, content=json.dumps(GOOD))
    lid = mine.json()["id"]
    r = _same(fast, routed, "DELETE", f"/v1/leases/{lid}", headers=auth(OTHER))  # another tenant's
    assert r.status_code == 404
    r = _same(fast, routed, "DELETE", "/v1/leases/no-such-lease", headers=auth())
    assert r.status_code == 404 and "no-such-lease" in r.text
    assert reached == []


def test_a_chunked_body_is_read_whole(pair: tuple[httpx.Client, httpx.Client, list[str]]) -> None:
    fast, routed, reached = pair
    doc = json.dumps(GOOD).encode()

    def parts() -> Iterator[bytes]:
        for i in range(0, len(doc), 5):
            yield doc[i : i + 5]

    a = fast.post("/v1/leases", headers={**auth(), **JSON}, content=parts())
    b = routed.post("/v1/leases", headers={**auth(), **JSON}, content=parts())
    assert a.status_code == b.status_code == 201 and a.json() == b.json()
    assert a.request.headers.get("transfer-encoding") == "chunked"
    bad = b"{" + b'"vram_mib": 1,' * 3 + b"}"
    a = fast.post("/v1/leases", headers={**auth(), **JSON}, content=iter([bad[:4], bad[4:]]))
    b = routed.post("/v1/leases", headers={**auth(), **JSON}, content=iter([bad[:4], bad[4:]]))
    assert a.status_code == b.status_code == 400 and a.json() == b.json()
    assert reached == ["POST /v1/leases"]  # the malformed one was handed on, its body replayed


FIELDS = ("priority", "vram_mib", "compute_pct", "compute_milli", "ttl_s", "kinds", "gpu_count", "gpu_id")
FIELDS += ("nodes", "preemptible", "model", "prompt_tokens", "max_tokens", "queue_timeout_s", "labels", "x")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0, 1, 64, 1024, 81920, 10**7, 2**63]),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10, max_value=10**5),
    st.sampled_from(["P0", "P1", "P2", "P9", "", "whole", "mps", "qwen2.5-0.5b", "gpu-a/0", "gpu-b"]),
    st.lists(st.sampled_from(["whole", "mps", "mig", "gpu-b", 3]), max_size=3),
    st.dictionaries(st.sampled_from(["team", "gpupool.io/x", ""]), st.sampled_from(["a", ""]), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    doc=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6),
    ctype=st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]),
    token=st.sampled_from([TOK, ADMIN, "nope"]),
    release=st.booleans(),
)
def test_any_body_gets_the_same_answer_both_ways(
    pair: tuple[httpx.Client, httpx.Client, list[str]],
    doc: dict[str, Any],
    ctype: str | None,
    token: str,
    release: bool,
) -> None:
    """Random bodies over the schema's fields (valid, out of range, wrong types, unknown keys),
    content types and tokens: the two gateways answer alike, and a granted lease released alike."""
    fast, routed, _ = pair
    headers = {**auth(token), **({"content-type": ctype} if ctype else {})}
    r = _same(fast, routed, "POST", "/v1/leases", headers=headers, content=json.dumps(doc))
    if release and r.status_code == 201:
        _same(fast, routed, "DELETE", f"/v1/leases/{r.json()['id']}", headers=auth(token))
