"""HEAD on the probe routes, over real HTTP (``curl -I``, uptime monitors, load-balancer checks send
HEAD): the gateway's ``/healthz``, ``/metrics`` and console pages, a standby's and a proxy replica's
``/healthz``, the emulated backend's ``/health`` and ``/metrics``, the node agent's ``/metrics`` and
the scheduler extender's ``/healthz`` / ``/readyz`` answer HEAD as they answer GET (status and
headers, ``Content-Length`` included), without a body. They all answered 405 (the extender 501).
HEAD is not added anywhere else: the lease and proxy routes still answer it 405."""

from __future__ import annotations

import http.client
import time
from urllib.parse import urlsplit

from gpupool.adapters.backends import EmulatedEngine, Roofline
from gpupool.adapters.backends.app import create_backend_app
from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.replica import ShareLoop, create_replica_app
from gpupool.adapters.http.standby import StandbyApp
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.metrics.dcgm import AgentGauges, AgentMetrics
from gpupool.adapters.metrics.gateway import GatewayMetrics
from gpupool.adapters.store import MemoryLeaseStore
from gpupool.adapters.store.etcd_server import free_port
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.replica import ProxyReplica
from tests.adapters.http.servers import running
from tests.adapters.k8s.k8s_helpers import make_pool

TOKENS = [("head-admin-token-01", "ops", "admin")]


def fetch(url: str, method: str) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, headers without Date, body as read)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
    try:
        conn.request(method, u.path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders() if k.lower() != "date"}, r.read()
    finally:
        conn.close()


def assert_head_like_get(base: str, *paths: str) -> None:
    for path in paths:
        status, headers, body = fetch(base + path, "GET")
        h_status, h_headers, h_body = fetch(base + path, "HEAD")
        assert (h_status, h_body) == (status, b""), (path, h_status, h_body)
        assert status == 200 and body, (path, status)
        assert h_headers["content-type"] == headers["content-type"], path
        if path != "/metrics":  # (the counts change between the two scrapes)
            assert h_headers["content-length"] == str(len(body)), path


def test_the_gateway_answers_head_on_its_probes_and_console_only() -> None:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    app = create_app(c, tokens=TokenTable(TOKENS), metrics=GatewayMetrics(c), tick_s=0.05)
    with running(app) as url:
        assert_head_like_get(url, "/healthz", "/metrics", "/", "/ui", "/ui/app.js")
        assert fetch(url + "/ui/nope.js", "HEAD")[::2] == (404, b"")
        for path in ("/v1/leases", "/v1/pool", "/v1/models"):
            assert fetch(url + path, "HEAD")[0] == 405, path


def test_a_standby_answers_head_on_its_probes_itself() -> None:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    nobody = f"http://127.0.0.1:{free_port()}"  # a forwarded HEAD would be 503 (leader unreachable)
    standby = StandbyApp(view=c, tokens=TokenTable(TOKENS), leader_url=lambda: nobody, self_url="http://me:1")  # type: ignore[arg-type]
    with running(standby) as url:
        assert_head_like_get(url, "/healthz", "/metrics")


def test_a_proxy_replica_answers_head_on_healthz() -> None:
    core = ProxyReplica(clock=FunctionClock(time.monotonic), lease_ids=lambda: "l", ticket_ids=lambda: "t")
    loop = ShareLoop(core, leader_url=f"http://127.0.0.1:{free_port()}", token="t", replica="r", ttl_s=3.0)
    with running(create_replica_app(core, loop, tokens=TokenTable(TOKENS)), plain=True) as url:
        status, _, _ = fetch(url + "/healthz", "GET")
        assert status == 503  # (no leader: no valid share)
        h_status, h_headers, h_body = fetch(url + "/healthz", "HEAD")
        assert (h_status, h_body) == (status, b"") and h_headers["content-type"] == "application/json"


def test_the_emulated_backend_answers_head_on_health_and_metrics() -> None:
    roof = Roofline(
        params=1e9, bytes_per_param=2, kv_bytes_per_token=131072, mem_bw_bytes_s=2e12, peak_flops=3e14
    )
    app = create_backend_app(EmulatedEngine(roof, kv_budget_mib=4096, speed=100.0), model="m")
    with running(app, plain=True) as url:
        assert fetch(url + "/health", "HEAD")[::2] == (200, b"")
        assert_head_like_get(url, "/metrics")


def test_the_agent_metrics_server_answers_head() -> None:
    server, port = AgentMetrics("node-a", lambda: AgentGauges(())).serve(host="127.0.0.1", port=0)
    try:
        assert_head_like_get(f"http://127.0.0.1:{port}", "/metrics")
        assert fetch(f"http://127.0.0.1:{port}/metrics", "DELETE")[0] == 405
    finally:
        server.shutdown()
        server.server_close()


def test_the_extender_answers_head_on_its_probes() -> None:
    server = ExtenderServer(Extender(make_pool()), prefix="/gpupool").start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert_head_like_get(url, "/healthz", "/readyz")
        assert fetch(url + "/gpupool/filter", "HEAD")[::2] == (405, b"")
    finally:
        server.stop()
