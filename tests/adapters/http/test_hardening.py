"""The lease API on hostile or careless input, over real HTTP: 4xx naming the field (never 5xx) and
nothing stored; body-size limits per route family; error texts with values; tenancy of ``victims``;
PUT/PATCH watermarks; SSE ids and ``Last-Event-ID``; offline ``/docs``; ``/metrics`` tenant labels."""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.http import jsonbody
from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.metrics.gateway import GatewayMetrics
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.watermarks import WatermarkConfig
from tests.adapters.http.servers import running

ADMIN, A, B = "admin-token-0001", "tenant-a-token-1", "tenant-b-token-2"
MAX_BODY, MAX_PROXY_BODY = 16384, 65536
JSON_CT = {"content-type": "application/json"}


def h(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[tuple[str, LeaseController]]:
    store = SqliteLeaseStore(tmp_path / "l.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    tokens = TokenTable([(ADMIN, "ops", "admin"), (A, "a", "tenant"), (B, "b", "tenant")])
    metrics = GatewayMetrics(c)
    app = create_app(
        c,
        tokens=tokens,
        metrics=metrics,
        tick_s=0.05,
        agent_events=True,
        max_body_bytes=MAX_BODY,
        max_proxy_body_bytes=MAX_PROXY_BODY,
        events_retain=8,
    )
    with running(app) as url:
        yield url, c
    store.close()


def state(c: LeaseController) -> Any:
    return (sorted((x.id, x.state.value) for x in c.leases()), [s.granted for s in c.allocator.states()])


# ---------------------------------------------------------------------- bounded JSON
def test_lone_surrogate_label_is_400_naming_the_field_and_nothing_is_stored(
    gw: tuple[str, LeaseController],
) -> None:
    url, c = gw
    body = b'{"vram_mib": 100, "labels": {"k": "\\ud800"}}'
    with httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post("/v1/leases", headers={**h(A), **JSON_CT}, content=body)
        assert r.status_code == 400, r.text
        assert r.json()["field"] == "labels.k" and "surrogate" in r.json()["error"]
        assert c.leases() == [] and c.store.leases() == []
        for tok in (A, ADMIN):
            assert cl.get("/v1/leases", headers=h(tok)).status_code == 200
        key = b'{"vram_mib": 100, "labels": {"\\udc00": "v"}}'
        r = cl.post("/v1/leases", headers={**h(A), **JSON_CT}, content=key)
        assert r.status_code == 400 and r.json()["field"] == "labels.\\udc00", r.text
    assert c.leases() == []


def test_a_key_named_twice_in_one_object_is_400_naming_it_and_nothing_is_stored(
    gw: tuple[str, LeaseController],
) -> None:
    """Read as its last value before: ``{"priority": "P2", "priority": "P0"}`` was a P0 lease, while a
    proxy or firewall in front that keeps the first value would have let a P2 request through."""
    url, c = gw
    with httpx.Client(base_url=url, timeout=10) as cl:
        for body in (
            b'{"vram_mib": 100, "priority": "P2", "priority": "P0"}',
            b'{"vram_mib": 100, "labels": {"team": "a", "team": "b"}}',
        ):
            r = cl.post("/v1/leases", headers={**h(A), **JSON_CT}, content=body)
            assert r.status_code == 400, r.text
            assert r.json()["field"] in ("priority", "team") and "twice" in r.json()["error"], r.text
        assert c.leases() == [] and c.store.leases() == []
        ok = cl.post(
            "/v1/leases", headers={**h(A), **JSON_CT}, content=b'{"vram_mib": 100, "labels": {"a": "x"}}'
        )
        assert ok.status_code == 201, ok.text
    assert jsonbody.loads(b'{"a": 1, "a": 2}') == {"a": 2}  # the proxy's bodies: passed on as sent


@pytest.mark.parametrize(
    "label",
    ["gpupool.io/pgid", "gpupool.io/pids", "gpupool.io/pauser", "gpupool.io/endpoint", "gpupool.io/pod",
     "gpupool.io/cgroup", "gpupool.io/anything-else"],
)  # fmt: skip
def test_labels_that_direct_node_agents_are_for_admins_only(
    gw: tuple[str, LeaseController], label: str
) -> None:
    """``gpupool.io/`` labels tell the node agents which processes to stop or kill, which endpoint to
    call and which pod to evict when the lease ends: a tenant could name another tenant's (or any)
    process group there, and the agent, running as root, signalled it. A tenant now gets 403 naming
    the label, nothing stored; an admin (the platform's job launcher) may set them."""
    url, c = gw
    body = {"vram_mib": 100, "priority": "P2", "labels": {label: "1", "team": "a"}}
    with httpx.Client(base_url=url, timeout=10) as cl:
        r = cl.post("/v1/leases", headers=h(A), json=body)
        assert r.status_code == 403, r.text
        assert r.json()["field"] == f"labels.{label}" and "admin" in r.json()["error"], r.text
        assert c.leases() == [] and c.store.leases() == []
        assert cl.post("/v1/leases", headers=h(A), json={**body, "labels": {"team": "a"}}).status_code == 201
        assert cl.post("/v1/leases", headers=h(ADMIN), json=body).status_code == 201


def test_node_readings_refuse_a_gpu_twice_and_xids_below_1(gw: tuple[str, LeaseController]) -> None:
    """One batch naming a GPU twice was read as its last entry, and a negative XID was taken as an
    event; both are 422 naming the field now, and nothing is read."""
    url, c = gw
    ok = {"gpu_id": "gpu-a/0", "vram_used_mib": 100, "vram_total_mib": 81920}
    with httpx.Client(base_url=url, timeout=10, headers=h(ADMIN)) as cl:
        r = cl.post("/v1/nodes/gpu-a/readings", json={"gpus": [ok, {**ok, "vram_used_mib": 80000}]})
        assert r.status_code == 422 and "gpus" in r.json()["field"] and "twice" in r.text, r.text
        r = cl.post("/v1/nodes/gpu-a/readings", json={"gpus": [{**ok, "xids": [-3]}]})
        assert r.status_code == 422 and "xids" in r.json()["field"], r.text
        assert "gpu-a/0" not in c.readings
        assert cl.post("/v1/nodes/gpu-a/readings", json={"gpus": [{**ok, "xids": [79]}]}).status_code == 200


def test_node_readings_refuse_more_vram_used_than_the_gpu_has(gw: tuple[str, LeaseController]) -> None:
    """A reading with vram_used_mib > vram_total_mib (a broken NVML read, a buggy agent) was taken as
    is and drove the watermarks past 100 %; it is 422 naming the field and both values, nothing read."""
    url, c = gw
    ok = {"gpu_id": "gpu-a/0", "vram_used_mib": 100, "vram_total_mib": 81920}
    with httpx.Client(base_url=url, timeout=10, headers=h(ADMIN)) as cl:
        r = cl.post("/v1/nodes/gpu-a/readings", json={"gpus": [{**ok, "vram_used_mib": 81921}]})
        assert r.status_code == 422, r.text
        assert "vram_used_mib" in r.json()["field"] and "81921" in r.text and "81920" in r.text, r.text
        assert "gpu-a/0" not in c.readings
        full = {**ok, "vram_used_mib": 81920}
        assert cl.post("/v1/nodes/gpu-a/readings", json={"gpus": [full]}).status_code == 200


ROUTES = [
    ("POST", "/v1/leases"),
    ("POST", "/v1/noop"),
    ("POST", "/v1/leases/x/renew"),
    ("POST", "/v1/nodes/gpu-a/readings"),
    ("POST", "/v1/nodes/gpu-a/events"),
    ("POST", "/v1/admin/gpus/gpu-a/0/drain"),
    ("POST", "/v1/admin/slices/gpu-a/0/mig-3g.40gb-0/health"),
    ("PUT", "/v1/admin/watermarks"),
    ("PATCH", "/v1/admin/watermarks"),
]


def test_deeply_nested_json_is_400_on_every_body_route(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    before = state(c)
    deep = b"[" * 1000 + b"]" * 1000
    inner = b'{"vram_mib": 1, "labels": ' + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}"
    with httpx.Client(base_url=url, headers={**h(ADMIN), **JSON_CT}, timeout=10) as cl:
        for method, path in ROUTES:
            for body in (deep, inner):
                r = cl.request(method, path, content=body)
                assert r.status_code == 400, (method, path, r.status_code, r.text[:200])
                assert r.json()["code"] == "invalid_json" and "nested deeper" in r.json()["error"]
    assert state(c) == before


def test_malformed_json_names_the_problem_not_a_byte_offset(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    with httpx.Client(base_url=url, headers={**h(A), **JSON_CT}, timeout=10) as cl:
        r = cl.post("/v1/leases", content=b'{"field":"12"')
        assert r.status_code == 400
        doc = r.json()
        assert doc["field"] == "body" and doc["code"] == "invalid_json"
        assert doc["error"] == "malformed JSON: Expecting ',' delimiter at line 1 column 14"
        for bad, words in (
            (b'{"vram_mib": NaN}', "NaN is not valid JSON"),
            (b"\xff\xfe", "not UTF-8"),
            (b'{"vram_mib": 1' + b"0" * 5000 + b"}", "integer literal longer than"),
        ):
            r = cl.post("/v1/leases", content=bad)
            assert r.status_code == 400 and words in r.json()["error"], r.text


def test_jsonbody_bounds_depth_and_checks_strings_anywhere() -> None:
    assert jsonbody.loads(b'{"a": [1, {"b": "\\u00e9"}]}') == {"a": [1, {"b": "\u00e9"}]}
    assert jsonbody.loads("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(jsonbody.JsonBodyError) as e:
        jsonbody.loads("[[[1]]]", max_depth=2)
    assert e.value.field == "0.0" and "deeper than 2" in str(e.value)
    with pytest.raises(jsonbody.JsonBodyError) as e:
        jsonbody.loads(b'{"messages": [{"content": "ok"}, {"content": "\\udfff"}]}')
    assert e.value.field == "messages.1.content"
    with pytest.raises(jsonbody.JsonBodyError) as e:
        jsonbody.loads(b"[" * 200_000 + b"]" * 200_000)
    assert e.value.field == "body"
    with pytest.raises(jsonbody.JsonBodyError, match="empty body"):
        jsonbody.loads(b"  ")


def test_error_texts_carry_values_not_python_reprs(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        r = cl.post("/v1/leases", json={"vram_mib": 100, "kinds": ["time-slice"], "gpu_count": 2})
        assert r.status_code == 422 and r.json()["field"] == "kinds"
        assert r.json()["error"].startswith('invalid kinds=["time-slice"]: '), r.text
        r = cl.post("/v1/leases", json={"vram_mib": 100, "kinds": ["time-slice"]})
        assert r.status_code == 503 and "of kind time-slice could" in r.json()["error"], r.text
        r = cl.post("/v1/leases", json={"vram_mib": 100, "priority": "P7"})
        assert r.json()["error"] == 'invalid priority="P7": expected P0, P1, P2 or an integer'
        r = cl.post("/v1/leases", json={"vram_mib": -5})
        assert r.status_code == 422 and r.json()["error"].startswith("invalid vram_mib=-5: "), r.text
        for text in (cl.post("/v1/leases", json={"vram_mib": 1, "kinds": ["x"]}).text,):
            assert "SliceKind" not in text and "[<" not in text and "'x'" not in text
        r = cl.get("/no/such/route")
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        r = cl.get("/v1/leases/nope")
        assert r.status_code == 404 and r.json()["error"] == 'unknown lease "nope"', r.text


def test_a_body_with_a_content_type_that_is_not_json_is_named_by_its_content_type(
    gw: tuple[str, LeaseController],
) -> None:
    """curl -d (a form), text/plain: the error names the Content-Type, never the bytes' Python repr."""
    url, c = gw
    before = state(c)
    body = b'{"vram_mib": 100}'
    with httpx.Client(base_url=url, headers=h(ADMIN), timeout=10) as cl:
        for ctype in ("text/plain", "application/x-www-form-urlencoded"):
            for method, path in (("POST", "/v1/leases"), ("PATCH", "/v1/admin/watermarks")):
                r = cl.request(method, path, content=body, headers={"content-type": ctype})
                assert r.status_code == 422 and r.json()["field"] == "body", r.text
                want = (
                    f'invalid body: Content-Type "{ctype}" is not JSON (send Content-Type: application/json)'
                )
                assert r.json()["error"] == want, r.text
        assert state(c) == before
        assert cl.post("/v1/leases", content=body, headers=JSON_CT).status_code == 201  # (as JSON: granted)


def test_a_compressed_body_is_415_naming_its_content_encoding_in_both_families(
    gw: tuple[str, LeaseController],
) -> None:
    """Before: a gzip body (``Content-Encoding: gzip``) was decoded as if plain and refused as
    "body is not UTF-8 (invalid byte at offset 1)", a misleading 400 in both route families; the
    gateway decodes no content coding, so it says that, naming the header's value."""
    url, c = gw
    before = state(c)
    lease = {"vram_mib": 100}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        for path, doc in (("/v1/leases", lease), ("/v1/chat/completions", chat)):
            for enc in ("gzip", "br, gzip"):
                raw = gzip.compress(json.dumps(doc).encode())
                r = cl.post(path, content=raw, headers={**JSON_CT, "content-encoding": enc})
                assert r.status_code == 415, (path, r.text)
                want = f'Content-Encoding "{enc}" is not supported: send the body uncompressed'
                err = r.json()["error"]
                if path == "/v1/leases":
                    assert err == want and r.json()["code"] == "unsupported_content_encoding", r.text
                    assert r.json()["field"] == "content-encoding"
                else:
                    assert err["message"] == want and err["code"] == "unsupported_content_encoding"
                    assert err["param"] == "content-encoding" and err["type"] == "invalid_request_error"
        assert state(c) == before
        # "identity" is no coding at all (the chat model is not served here: 404 past the check)
        ident = {**JSON_CT, "content-encoding": "identity"}
        assert cl.post("/v1/leases", json=lease, headers=ident).status_code == 201
        assert cl.post("/v1/chat/completions", json=chat, headers=ident).status_code == 404


def test_error_texts_never_echo_more_than_a_line_of_what_was_sent(gw: tuple[str, LeaseController]) -> None:
    """An unknown id or model of 50,000 characters is named, cut, in a short error: the answer to a
    bad request is never as large as the request."""
    url, _ = gw
    huge = "z" * 50_000
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        for r in (cl.get(f"/v1/leases/{huge}"), cl.delete(f"/v1/leases/{huge}")):
            assert r.status_code == 404 and r.json()["code"] == "not_found", r.text[:200]
            assert r.json()["error"].startswith('unknown lease "zzz') and r.json()["error"].endswith("...")
            assert len(r.content) < 400
        body = {"model": huge, "messages": [{"role": "user", "content": "hi"}]}
        r = cl.post("/v1/chat/completions", json=body)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text[:200]
        assert "zzz..." in r.json()["error"]["message"] and len(r.content) < 400


def test_nodes_naming_no_node_of_the_pool_is_422_like_an_unknown_gpu_id(
    gw: tuple[str, LeaseController],
) -> None:
    """A typo in ``nodes`` is bad input (422 naming the field and the value), as an unknown ``gpu_id``
    is, not a 503 that tells the client the pool cannot serve it; a list naming one real node is fine."""
    url, c = gw
    before = state(c)
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        for body in (
            {"vram_mib": 100, "nodes": ["gpu-z"]},
            {"vram_mib": 100, "nodes": ["gpu-z", ""]},
            {"vram_mib": 100, "nodes": ["gpu-z"], "gpu_count": 2},
        ):
            r = cl.post("/v1/leases", json=body)
            assert r.status_code == 422 and r.json()["field"] == "nodes", r.text
            assert r.json()["error"].startswith("invalid nodes=["), r.text
            assert '"gpu-z"]: no such node in the pool' in r.json()["error"], r.text
        r = cl.post("/v1/leases", json={"vram_mib": 100, "gpu_id": "gpu-q/0"})
        assert r.status_code == 422 and r.json()["field"] == "gpu_id", r.text
        assert state(c) == before
        r = cl.post("/v1/leases", json={"vram_mib": 100, "nodes": ["gpu-z", "gpu-a"]})
        assert r.status_code == 201 and r.json()["node"] == "gpu-a", r.text


def test_an_unresolvable_request_naming_many_nodes_gets_a_short_error(
    gw: tuple[str, LeaseController],
) -> None:
    """70 node names of 200 characters (one of them real) in a request no slice could hold: the 503
    names a few of them and how many, not all 14 KB of them."""
    url, c = gw
    nodes = ["gpu-a", *(f"{i:04d}" + "n" * 196 for i in range(70))]
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        r = cl.post("/v1/leases", json={"vram_mib": 1_000_000, "nodes": nodes})
        assert r.status_code == 503 and r.json()["code"] == "unresolvable", r.text[:200]
        assert "nodes 0000nnn" in r.json()["error"] and "(71 nodes)" in r.json()["error"], r.text[:400]
        assert len(r.content) < 1200, len(r.content)
        r = cl.post("/v1/leases", json={"vram_mib": 1_000_000, "nodes": nodes, "gpu_count": 2})
        assert r.status_code == 503 and "71 nodes" in r.json()["error"], r.text[:200]
        assert len(r.content) < 1200, len(r.content)
    assert c.leases() == []


def test_label_count_and_size_limits_name_the_field(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    with httpx.Client(base_url=url, headers=h(A), timeout=10) as cl:
        r = cl.post("/v1/leases", json={"vram_mib": 1, "labels": {f"k{i}": "v" for i in range(65)}})
        assert r.status_code == 422 and r.json()["field"] == "labels", r.text
        r = cl.post("/v1/leases", json={"vram_mib": 1, "labels": {"k" * 129: "v"}})
        assert r.status_code == 422 and r.json()["field"].startswith("labels."), r.text
        r = cl.post("/v1/leases", json={"vram_mib": 1, "labels": {"k": "v" * 1025}})
        assert r.status_code == 422 and r.json()["field"] == "labels.k", r.text
        r = cl.post("/v1/leases", json={"vram_mib": 1, "labels": {"": "v"}})
        assert r.status_code == 422, r.text
    assert c.leases() == []


# ---------------------------------------------------------------------- body size
def test_body_limits_per_route_family_are_413_in_the_family_shape(gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    big = json.dumps({"vram_mib": 1, "labels": {"k": "v" * (MAX_BODY + 10)}}).encode()
    with httpx.Client(base_url=url, headers={**h(A), **JSON_CT}, timeout=10) as cl:
        r = cl.post("/v1/leases", content=big)
        assert r.status_code == 413, r.text
        assert r.json()["code"] == "body_too_large" and r.json()["field"] == "body"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            for i in range(0, len(big), 1000):
                yield big[i : i + 1000]

        r = cl.post("/v1/leases", content=chunks())
        assert r.status_code == 413 and r.json()["code"] == "body_too_large", r.text
        # the OpenAI routes have their own, larger limit and OpenAI's error shape
        mid = json.dumps({"model": "none", "prompt": "x" * (MAX_BODY * 2)}).encode()
        r = cl.post("/v1/completions", content=mid)
        assert r.status_code in (400, 404, 503), r.text  # past the lease limit, under the proxy one
        huge = json.dumps({"model": "none", "prompt": "x" * MAX_PROXY_BODY}).encode()
        r = cl.post("/v1/completions", content=huge)
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text
        assert cl.post("/v1/leases", json={"vram_mib": 1}).status_code == 201
    assert len(c.leases()) == 1


# ---------------------------------------------------------------------- tenancy
def test_p0_victims_list_only_the_callers_own_leases(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    half = {"priority": "P2", "vram_mib": 20 * 1024, "kinds": ["mig"], "gpu_id": "gpu-a/0"}
    with httpx.Client(base_url=url, timeout=10) as cl:
        mine = cl.post("/v1/leases", headers=h(A), json=half).json()
        theirs = cl.post("/v1/leases", headers=h(B), json=half).json()
        assert mine["slice_id"] == theirs["slice_id"] == "gpu-a/0/mig-3g.40gb-0"
        p0 = cl.post(
            "/v1/leases", headers=h(A), json={"priority": "P0", "vram_mib": 40 * 1024, "kinds": ["mig"]}
        )
        assert p0.status_code == 201, p0.text
        assert p0.json()["victims"] == [mine["id"]] and p0.json()["victims_other_tenants"] == 1
        assert theirs["id"] not in p0.text
        assert p0.json()["band"] == "P0" and p0.json()["priority"] == 100
        assert cl.get(f"/v1/leases/{theirs['id']}", headers=h(B)).json()["state"] == "preempted"
        r = cl.post("/v1/leases", headers=h(B), json={"priority": 10, "vram_mib": 1024})
        assert r.json()["band"] == "P1" and r.json()["priority"] == 10
        r = cl.post("/v1/leases", headers=h(B), json={"priority": "p2", "vram_mib": 1024})
        assert r.json()["band"] == "P2" and r.json()["priority"] == -1


def test_metrics_show_tenant_names_only_when_asked(tmp_path: Path, gw: tuple[str, LeaseController]) -> None:
    url, c = gw
    with httpx.Client(base_url=url, timeout=10) as cl:
        assert cl.post("/v1/leases", headers=h(A), json={"vram_mib": 1024}).status_code == 201
        text = cl.get("/metrics").text
    assert 'gpupool_leases{band="P1",state="active"} 1.0' in text
    assert 'tenant="a"' not in text
    opted = GatewayMetrics(c, tenant_labels=True).render()[0].decode()
    assert 'gpupool_leases{band="P1",state="active",tenant="a"} 1.0' in opted


# ---------------------------------------------------------------------- watermarks
def test_put_watermarks_needs_every_field_and_patch_changes_only_what_it_names(
    gw: tuple[str, LeaseController],
) -> None:
    url, c = gw
    full = {"vram_high": 0.9, "vram_low": 0.6, "temp_high_c": 85, "temp_low_c": 70, "early_warning": 0.8}
    with httpx.Client(base_url=url, headers=h(ADMIN), timeout=10) as cl:
        assert cl.put("/v1/admin/watermarks", json=full).json() == full
        r = cl.put("/v1/admin/watermarks", json={})
        assert r.status_code == 422 and r.json()["field"] in full, r.text
        r = cl.put("/v1/admin/watermarks", json={k: v for k, v in full.items() if k != "temp_low_c"})
        assert r.status_code == 422 and r.json()["field"] == "temp_low_c", r.text
        assert cl.get("/v1/admin/watermarks").json() == full
        r = cl.patch("/v1/admin/watermarks", json={"vram_high": 0.95})
        assert r.status_code == 200 and r.json() == {**full, "vram_high": 0.95}
        r = cl.patch("/v1/admin/watermarks", json={"vram_low": 0.99})
        assert r.status_code == 422 and r.json()["field"] == "watermarks.vram_low", r.text
        assert cl.patch("/v1/admin/watermarks", json={}).json() == {**full, "vram_high": 0.95}
        assert cl.patch("/v1/admin/watermarks", headers=h(A), json={}).status_code == 403
        assert cl.put("/v1/admin/watermarks", headers=h(A), json={}).status_code == 403
    assert c.bank.config.vram_high == 0.95 and c.bank.config.temp_low_c == 70


def test_the_documented_watermark_reset_gives_the_defaults(gw: tuple[str, LeaseController]) -> None:
    """docs/ops/upgrading.md's "Watermarks back to the defaults" body, sent as it is written."""
    url, c = gw
    doc = (Path(__file__).resolve().parents[3] / "docs" / "ops" / "upgrading.md").read_text()
    found = re.search(
        r"\*\*Watermarks back to the defaults\*\*.*?`PUT /v1/admin/watermarks` with\s+`([^`]*)`", doc, re.S
    )
    assert found, "upgrading.md no longer shows the watermark reset"
    with httpx.Client(base_url=url, headers=h(ADMIN), timeout=10) as cl:
        cl.put(
            "/v1/admin/watermarks", json={**asdict(WatermarkConfig()), "vram_high": 0.95, "temp_low_c": 60}
        )
        r = cl.put("/v1/admin/watermarks", content=found.group(1), headers=JSON_CT)
        assert r.status_code == 200, r.text
    assert c.bank.config == WatermarkConfig()


def test_true_is_not_a_number_anywhere(gw: tuple[str, LeaseController]) -> None:
    """JSON ``true`` is refused where a number of seconds or a fraction is expected (it was taken as 1)."""
    url, c = gw
    before = c.bank.config
    with httpx.Client(base_url=url, headers=h(ADMIN), timeout=10) as cl:
        for body in ({"early_warning": True}, {"vram_high": False}):
            r = cl.patch("/v1/admin/watermarks", json=body)
            assert r.status_code == 422 and r.json()["field"] == next(iter(body)), r.text
        for body in ({"ttl_s": True}, {"queue_timeout_s": True}, {"wait_s": True}):
            r = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 100, **body})
            assert r.status_code == 422 and r.json()["field"] == next(iter(body)), r.text
    assert c.bank.config == before
    assert not c.leases()


# ---------------------------------------------------------------------- SSE ids / Last-Event-ID
def read_events(url: str, tok: str, n: int, last_id: str | None = None) -> list[dict[str, Any]]:
    """The first ``n`` events of a fresh ``/v1/events`` stream (with ``Last-Event-ID``)."""
    out: list[dict[str, Any]] = []
    headers = h(tok) if last_id is None else {**h(tok), "Last-Event-ID": last_id}
    with httpx.Client(base_url=url, timeout=10) as cl, cl.stream("GET", "/v1/events", headers=headers) as r:
        assert r.status_code == 200
        cur: dict[str, Any] = {}
        for line in r.iter_lines():
            if line.startswith("id: "):
                cur["id"] = line[4:]
            elif line.startswith("event: "):
                cur["event"] = line[7:]
            elif line.startswith("data: "):
                cur["data"] = json.loads(line[6:])
            elif line == "" and "event" in cur:
                out.append(cur)
                cur = {}
                if len(out) >= n:
                    return out
    return out


def test_events_carry_ids_and_last_event_id_resumes_without_loss(gw: tuple[str, LeaseController]) -> None:
    url, _ = gw
    seen: list[dict[str, Any]] = []
    ready = threading.Event()

    def first() -> None:
        with httpx.Client(base_url=url, timeout=10) as cl, cl.stream("GET", "/v1/events", headers=h(A)) as r:
            ready.set()
            for line in r.iter_lines():
                if line.startswith("id: "):
                    seen.append({"id": line[4:]})
                    return

    t = threading.Thread(target=first, daemon=True)
    t.start()
    assert ready.wait(5)
    with httpx.Client(base_url=url, timeout=10) as cl:
        ids = [cl.post("/v1/leases", headers=h(A), json={"vram_mib": 1024}).json()["id"] for _ in range(3)]
        cl.post("/v1/leases", headers=h(B), json={"vram_mib": 1024})  # not A's: never replayed to A
        t.join(5)
        assert seen, "no id: line on the stream"
        first_id = seen[0]["id"]
        resumed = read_events(url, A, 2, last_id=first_id)  # the 2 grants after the first one
        assert [e["data"]["lease"]["id"] for e in resumed] == ids[1:]
        assert all(e["event"] == "granted" and e["id"] > first_id for e in resumed)
        for lid in ids:
            cl.delete(f"/v1/leases/{lid}", headers=h(A))
        for _ in range(6):
            cl.delete(f"/v1/leases/{ids[0]}", headers=h(A))  # idempotent: no new events
        for _ in range(8):  # push the first grant out of the 8-event window
            lid = cl.post("/v1/leases", headers=h(A), json={"vram_mib": 1024}).json()["id"]
            cl.delete(f"/v1/leases/{lid}", headers=h(A))
    gap = read_events(url, A, 1, last_id=first_id)
    assert gap[0]["event"] == "gap" and "retention window of 8" in gap[0]["data"]["reason"]
    other = read_events(url, A, 1, last_id="deadbeef-3")
    assert other[0]["event"] == "gap" and "unknown event id" in other[0]["data"]["reason"]


def test_last_event_id_with_non_ascii_digits_gets_a_gap_not_a_500(gw: tuple[str, LeaseController]) -> None:
    """A header byte such as 0xB2 decodes to a character that ``str.isdigit`` accepts but ``int``
    does not (superscript two): the stream starts with a ``gap`` like any other foreign id."""
    url, _ = gw
    for seq in (b"\xb2", b"1\xb9", b"\xbc"):
        headers = {**h(A), "Last-Event-ID": b"deadbeef-" + seq}
        with (
            httpx.Client(base_url=url, timeout=10) as cl,
            cl.stream("GET", "/v1/events", headers=headers) as r,
        ):
            assert r.status_code == 200, (seq, r.read())
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    assert data["kind"] == "gap" and "unknown event id" in data["reason"], data
                    break


# ---------------------------------------------------------------------- docs / OpenAPI
def test_docs_are_offline_and_the_openapi_declares_bearer_auth_and_real_shapes(
    gw: tuple[str, LeaseController],
) -> None:
    url, _ = gw
    with httpx.Client(base_url=url, timeout=10) as cl:
        page = cl.get("/docs")
        assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "http://" not in page.text and "https://" not in page.text and "cdn" not in page.text
        js = cl.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200 and len(js.content) > 100_000 and "SwaggerUIBundle" in js.text
        assert cl.get("/docs/assets/swagger-ui.css").status_code == 200
        assert "Apache License" in cl.get("/docs/assets/LICENSE").text
        spec = cl.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["bearer"]["description"],
    }
    ops = spec["paths"]
    assert ops["/v1/leases"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in ops["/healthz"]["get"]
    listed = ops["/v1/leases"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed == {"$ref": "#/components/schemas/LeasesOut"}
    assert spec["components"]["schemas"]["LeasesOut"]["required"] == ["leases"]
    assert {"band", "victims_other_tenants"} <= set(spec["components"]["schemas"]["LeaseOut"]["properties"])
    assert "patch" in ops["/v1/admin/watermarks"] and "put" in ops["/v1/admin/watermarks"]
    ids = [op["operationId"] for path in ops.values() for op in path.values() if "operationId" in op]
    assert len(ids) == len(set(ids))  # (a route with GET and HEAD once gave two operations one id)
    assert "head" not in ops["/healthz"]
    assert "P0 = 100" in json.dumps(ops["/v1/leases"]["post"])
