"""`gpupool bench gateway`: lease round trips over HTTP against the framework's own ceiling, and the
OpenAI proxy's added latency.

Method:
1. A gateway server runs in its own process (uvicorn + uvloop + httptools, one worker, access log off)
   over 64 whole 80 GiB GPUs, with the SQLite store in WAL mode and ``synchronous=FULL`` (durable
   commits, group-committed: one transaction per batch of concurrent requests).
2. ``clients`` raw asyncio HTTP/1.1 keep-alive connections (the cheapest load generator we can write,
   in this process) loop for ``duration_s``: a *lease round trip* is ``POST /v1/leases`` (1 GiB, P1)
   then ``DELETE /v1/leases/{id}``; a *no-op round trip* is ``POST /v1/noop`` (same body, same auth
   and validation, no core, no store) then ``DELETE /v1/noop/{id}``. Both phases run in the same run,
   same clients, after 1 s of warm-up each; the no-op rate is the framework's ceiling on this machine.
3. Proxy overhead: an emulated backend (qwen2.5-0.5b, ``--speed 1000``) in a third process; one client
   loop sends ``/v1/completions`` (``max_tokens: 1``) directly to it, then the same through the
   gateway (auth, priority header, KV request lease, forward, release). ``proxy_added_p50_ms`` is the
   difference of the two medians; the same is repeated with ``proxy_clients`` concurrent loops
   (``proxy_added_p50_ms_at_N_clients``), where three processes share the 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

TOKEN = "bench-tenant-token-0001"
LEASE_BODY = json.dumps({"priority": "P1", "vram_mib": 1024, "ttl_s": 60}).encode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------- server side (subprocess)
def serve_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--backend-url", default="")
    ap.add_argument("--model", default="qwen2.5-0.5b")
    a = ap.parse_args(argv)
    import uvicorn

    from gpupool.adapters.http.app import create_app
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.adapters.store import SqliteLeaseStore
    from gpupool.cli.serve import KvSizer
    from gpupool.core.clock import FunctionClock
    from gpupool.core.controller import LeaseController
    from gpupool.core.ports import Backend
    from gpupool.hardware.slices import Slice, SliceKind
    from gpupool.hardware.units import Resources

    slices = [
        Slice(
            id=f"n{i // 8}/{i % 8}",
            node=f"n{i // 8}",
            gpu_id=f"n{i // 8}/{i % 8}",
            kind=SliceKind.WHOLE,
            capacity=Resources(81920, 1000),
            gpu_model="H100-SXM5-80GB",
        )
        for i in range(64)
    ]
    store = SqliteLeaseStore(Path(a.data_dir) / "leases.db", durable=True)
    c = LeaseController(slices, clock=FunctionClock(time.time), store=store)
    c.recover()
    if a.backend_url:
        c.register_backend(
            Backend("b0", a.model, a.backend_url, node="n0", gpu_id="n0/0", kv_budget_mib=65536)
        )
    from gpupool.adapters.metrics.gateway import GatewayMetrics

    box: list[Any] = []
    metrics = GatewayMetrics(c, commits=lambda: (box[0].batches, box[0].writes))
    app = create_app(c, tokens=TokenTable([(TOKEN, "bench", "tenant")]), sizer=KvSizer(), metrics=metrics)
    box.append(app.state.gateway.committer)
    mode = os.environ.get("GPUPOOL_BENCH_COMMIT", "inline")  # inline | split | thread
    app.state.gateway.committer.split = mode == "split"
    app.state.gateway.committer.inline = mode == "inline"
    app.state.gateway.hub.extra.append(metrics.observe_event)
    from gpupool.cli.serve import tune_gc

    tune_gc()  # as `gpupool serve` does
    prof_path = os.environ.get("GPUPOOL_BENCH_PROFILE")
    prof = None
    if prof_path:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=a.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )
    if prof is not None and prof_path:
        prof.disable()
        prof.dump_stats(prof_path)


# ---------------------------------------------------------------------- client side
async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length) if length else b""
    return status, body


def _request(method: str, path: str, body: bytes = b"", *, host: str, extra: str = "") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _loop(  # noqa: PLR0917 (one client's whole configuration)
    port: int, kind: str, t_start: float, t_end: float, lat: list[float], errors: list[int]
) -> None:
    host = f"127.0.0.1:{port}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    acquire = "/v1/leases" if kind == "lease" else "/v1/noop"
    post = _request("POST", acquire, LEASE_BODY, host=host)
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            writer.write(post)
            status, body = await _read_response(reader)
            if status != 201:
                errors.append(status)
                continue
            lid = json.loads(body)["id"]
            writer.write(_request("DELETE", f"{acquire}/{lid}", host=host))
            status, _ = await _read_response(reader)
            if status != 200:
                errors.append(status)
            t1 = time.perf_counter()
            if t0 >= t_start:
                lat.append(t1 - t0)
    finally:
        writer.close()


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _phase(
    port: int, kind: str, clients: int, duration_s: float, warmup_s: float = 1.0
) -> dict[str, Any]:
    lat: list[float] = []
    errors: list[int] = []
    now = time.perf_counter()
    t_start, t_end = now + warmup_s, now + warmup_s + duration_s
    await asyncio.gather(*(_loop(port, kind, t_start, t_end, lat, errors) for _ in range(clients)))
    return {
        "round_trips_per_s": len(lat) / duration_s,
        "p50_ms": _pct(lat, 0.50) * 1000,
        "p99_ms": _pct(lat, 0.99) * 1000,
        "round_trips": len(lat),
        "errors": len(errors),
    }


async def _proxy_phase(
    url_port: int, *, via_gateway: bool, model: str, clients: int, duration_s: float
) -> float:
    lat: list[float] = []
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 1}).encode()
    extra = "x-gpupool-priority: P0\r\n" if via_gateway else ""
    now = time.perf_counter()
    t_start, t_end = now + 0.5, now + 0.5 + duration_s

    async def one() -> None:
        host = f"127.0.0.1:{url_port}"
        reader, writer = await asyncio.open_connection("127.0.0.1", url_port)
        req = _request("POST", "/v1/completions", body, host=host, extra=extra)
        try:
            while (t0 := time.perf_counter()) < t_end:
                writer.write(req)
                status, _ = await _read_response(reader)
                if status == 200 and t0 >= t_start:
                    lat.append(time.perf_counter() - t0)
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return _pct(lat, 0.5) * 1000


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open")


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return float("nan")


def run(
    *, clients: int = 32, duration_s: float = 20.0, proxy_clients: int = 4, proxy_duration_s: float = 5.0
) -> dict[str, Any]:
    runner: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    model = "qwen2.5-0.5b"
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        try:
            bport, gport = _free_port(), _free_port()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            backend = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpupool.cli.main",
                    "emulate-backend",
                    "--model",
                    model,
                    "--port",
                    str(bport),
                    "--gpu",
                    "H100-SXM5-80GB",
                    "--speed",
                    "1000",
                    "--kv-budget-mib",
                    "65536",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            procs.append(backend)
            gateway = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpupool_benchmarks.gateway_bench",
                    "serve",
                    "--port",
                    str(gport),
                    "--data-dir",
                    tmp,
                    "--backend-url",
                    f"http://127.0.0.1:{bport}",
                    "--model",
                    model,
                ],
                env=env,
            )
            procs.append(gateway)
            _wait_port(bport, backend)
            _wait_port(gport, gateway)
            noop = runner(_phase(gport, "noop", clients, duration_s))
            lease = runner(_phase(gport, "lease", clients, duration_s))
            commits = _metric(gport, "gpupool_store_commits_total")
            proxy = {}
            for n in sorted({1, proxy_clients}):
                direct = runner(
                    _proxy_phase(
                        bport, via_gateway=False, model=model, clients=n, duration_s=proxy_duration_s
                    )
                )
                via = runner(
                    _proxy_phase(gport, via_gateway=True, model=model, clients=n, duration_s=proxy_duration_s)
                )
                proxy[n] = (direct, via)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(10)
    return {
        "benchmark": "gateway",
        "lease_round_trips_per_s": round(lease["round_trips_per_s"], 1),
        "noop_round_trips_per_s": round(noop["round_trips_per_s"], 1),
        "lease_vs_noop": round(lease["round_trips_per_s"] / max(1e-9, noop["round_trips_per_s"]), 3),
        "lease_p50_ms": round(lease["p50_ms"], 3),
        "lease_p99_ms": round(lease["p99_ms"], 3),
        "noop_p50_ms": round(noop["p50_ms"], 3),
        "noop_p99_ms": round(noop["p99_ms"], 3),
        "lease_errors": lease["errors"],
        "noop_errors": noop["errors"],
        "store": "sqlite WAL synchronous=FULL, group commit",
        "store_commits": commits,
        "lease_writes_per_commit": round(2 * lease["round_trips"] / commits, 2) if commits > 0 else None,
        "proxy_direct_p50_ms": round(proxy[1][0], 3),
        "proxy_via_gateway_p50_ms": round(proxy[1][1], 3),
        "proxy_added_p50_ms": round(proxy[1][1] - proxy[1][0], 3),
        f"proxy_added_p50_ms_at_{proxy_clients}_clients": round(
            proxy[proxy_clients][1] - proxy[proxy_clients][0], 3
        ),
        "clients": clients,
        "proxy_clients": proxy_clients,
        "duration_s": duration_s,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve_main(sys.argv[2:])
    else:
        print(json.dumps(run()))
