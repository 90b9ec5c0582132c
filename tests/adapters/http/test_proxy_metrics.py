"""`GatewayMetrics.observe_proxy`: counts per (model, status) and latency per model, each observation
landing in its own series (the labelled children are cached per (model, status)); over real HTTP, a
backend that fails mid-response is counted as the 502 its client got."""

from __future__ import annotations

import time

from gpupool.adapters.metrics.gateway import GatewayMetrics
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController


def _sample(text: str, name: str, labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{labels}}} in the exposition")


def test_observe_proxy_counts_each_model_and_status_apart() -> None:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    m = GatewayMetrics(c)
    for model, status, ttft in [("a", 200, 0.01), ("a", 200, 0.02), ("a", 502, None), ("b", 200, 0.5)]:
        m.observe_proxy(model, status, ttft, 1.0)
    text = m.render()[0].decode()
    assert _sample(text, "gpupool_proxy_requests_total", 'model="a",status="200"') == 2
    assert _sample(text, "gpupool_proxy_requests_total", 'model="a",status="502"') == 1
    assert _sample(text, "gpupool_proxy_requests_total", 'model="b",status="200"') == 1
    assert _sample(text, "gpupool_proxy_latency_seconds_count", 'model="a"') == 3
    assert _sample(text, "gpupool_proxy_ttft_seconds_count", 'model="a"') == 2  # no TTFT for a 502
    assert _sample(text, "gpupool_proxy_ttft_seconds_count", 'model="b"') == 1


def test_pending_observations_are_folded_exactly_at_scrape_and_when_many() -> None:
    from gpupool.adapters.metrics.gateway import PROXY_FOLD_EVERY

    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    m = GatewayMetrics(c)
    for _ in range(PROXY_FOLD_EVERY + 3):  # one automatic fold on the way, 3 left pending
        m.observe_proxy("a", 200, 0.01, 0.02)
    assert len(m._pending) == 3
    text = m.render()[0].decode()
    assert _sample(text, "gpupool_proxy_requests_total", 'model="a",status="200"') == PROXY_FOLD_EVERY + 3
    assert _sample(text, "gpupool_proxy_latency_seconds_count", 'model="a"') == PROXY_FOLD_EVERY + 3
    assert not m._pending
    text = m.render()[0].decode()  # a second scrape counts nothing twice
    assert _sample(text, "gpupool_proxy_requests_total", 'model="a",status="200"') == PROXY_FOLD_EVERY + 3


def test_proxy_histograms_match_prometheus_clients_own() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from gpupool.adapters.metrics.gateway import LATENCY_BUCKETS

    values = [0.0005, 0.001, 0.0011, 0.025, 0.3, 1.0, 2.0, 45.0, 61.0]
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    m = GatewayMetrics(c)
    reg = CollectorRegistry()
    ref = Histogram("gpupool_proxy_latency_seconds", "x", ["model"], buckets=LATENCY_BUCKETS, registry=reg)
    for v in values:
        m.observe_proxy("a", 200, None, v)
        ref.labels("a").observe(v)
    ours = {
        ln for ln in m.render()[0].decode().splitlines() if ln.startswith("gpupool_proxy_latency_seconds_")
    }
    theirs = {
        ln
        for ln in generate_latest(reg).decode().splitlines()
        if ln.startswith("gpupool_proxy_latency_seconds_")
    }
    strip = {ln for ln in theirs if "_created" not in ln}
    assert ours - {ln for ln in ours if "_created" in ln} == strip


def test_a_backend_that_fails_mid_response_is_counted_as_the_502_the_client_got() -> None:
    """A backend that sends its head and then closes before the body is complete: the client gets 502
    ``failed mid-response``; the request was counted nowhere (a backend that cannot be reached is
    counted as 502), so ``gpupool_proxy_requests_total`` hid exactly the failures it is there for."""
    import socket
    import threading

    import httpx

    from gpupool.adapters.http.app import create_app
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.core.ports import Backend
    from tests.adapters.http.servers import running

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def cut_short() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                head, _, body = buf.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(v)
                        for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n")[1:])
                        if k.strip().lower() == b"content-length"
                    ),
                    0,
                )
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                conn.sendall(
                    b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"id"'
                )

    threading.Thread(target=cut_short, daemon=True).start()
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    c.register_backend(
        Backend(
            "cut", "cut-model", f"http://127.0.0.1:{port}", node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=1024
        )
    )
    metrics = GatewayMetrics(c)
    app = create_app(c, tokens=TokenTable([("metrics-tenant-token", "t", "tenant")]), metrics=metrics)
    try:
        with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
            r = cl.post(
                "/v1/completions",
                headers={"Authorization": "Bearer metrics-tenant-token"},
                json={"model": "cut-model", "prompt": "x", "max_tokens": 4},
            )
            assert r.status_code == 502 and "mid-response" in r.text, r.text
            text = cl.get("/metrics").text
    finally:
        listener.close()
    assert _sample(text, "gpupool_proxy_requests_total", 'model="cut-model",status="502"') == 1
    assert _sample(text, "gpupool_proxy_latency_seconds_count", 'model="cut-model"') == 1
    assert c.request_lease_count() == 0


def test_lease_events_are_counted_per_kind_and_band() -> None:
    """`observe_event` keeps one counter child per (kind, band): each event lands in its own series."""
    from gpupool.core.model import Lease, Request
    from gpupool.core.ports import GatewayEvent
    from gpupool.hardware.units import Resources

    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    m = GatewayMetrics(c)

    def lease(priority: int) -> Lease:
        req = Request(id="r", tenant="t", priority=priority, demand=Resources(1024, 0), ttl_s=60.0)
        return Lease(id="l", request=req, node="n", grants=(), granted_at=0.0, expires_at=60.0)

    events = [("granted", 50), ("granted", 50), ("released", 50), ("granted", 100), ("released", -1)]
    for kind, prio in events:
        m.observe_event(GatewayEvent(kind=kind, at=0.0, lease=lease(prio)))
    m.observe_event(GatewayEvent(kind="paused", at=0.0))
    text = m.render()[0].decode()
    assert _sample(text, "gpupool_lease_events_total", 'band="P1",kind="granted"') == 2
    assert _sample(text, "gpupool_lease_events_total", 'band="P1",kind="released"') == 1
    assert _sample(text, "gpupool_lease_events_total", 'band="P0",kind="granted"') == 1
    assert _sample(text, "gpupool_lease_events_total", 'band="P2",kind="released"') == 1
    assert _sample(text, "gpupool_lease_events_total", 'band="",kind="paused"') == 1
