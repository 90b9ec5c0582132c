"""`gpupool bench kv`: prefix-cache routing on a Mooncake-format trace, gpupool vs round robin vs
vllm-router's ``cache_aware``, against N emulated instances with a GPU prefix cache and a host tier.

Method:
1. The trace: JSONL, one request a line: ``timestamp`` (ms), ``input_length``, ``output_length``,
   ``hash_ids`` (one id per 512-token prompt block). ``--limit`` keeps the first N requests;
   ``--arrival burst:S`` derives a burstier trace (every request of each S-second window arrives at
   the window's start), ``--arrival stretch:F`` multiplies every arrival time by F (the same
   requests at 1/F the rate); ``--time-scale K`` replays K times faster than recorded, with the engines K
   times faster too, so every TTFT is reported in trace time (wall x K; the gateways' own latency is
   scaled with it, a pessimistic bias for the two proxies).
2. Each request is rendered as text whose emulated tokens follow its hash ids (512 tokens per id, a
   deterministic three-letter word per (id, position); the last block cut to ``input_length``), so
   any router that matches text prefixes (vllm-router's radix tree) and the engines' 512-token
   block hashes see the same prefixes. Sent as a streaming ``/v1/completions`` with
   ``max_tokens = output_length``.
3. Sessions: the trace has none, so the client derives them as an agent platform knows them: a
   request continues the session of the earlier request it shares the longest prefix with (at least
   two blocks: a shared system prompt alone is not a conversation). gpupool gets it as
   ``x-gpupool-session``; the other routers ignore it.
4. Instances: ``instances`` emulated backends (own processes), each ``MODEL`` on a ``SLICE``
   (roofline timing at the slice's share of the GPU, KV budget = slice memory - weights - overhead,
   a host tier of ``host_tier_mib``, PCIe from the GPU's host link; ``stream_interval`` tokens per
   streamed chunk after the first, to spare the replay's CPU). Fresh instances for each router
   (empty caches). Routers: ``round-robin`` (the client cycles over the instances), ``vllm-router-
   cache-aware`` (PyPI ``vllm-router``, ``--policy cache_aware``, installed on demand into
   ``--peers-venv``), ``gpupool`` (the gateway app with the instances registered at their KV budget,
   the red line at 90 %, the engines' host tier mirrored, in its own process). The client sends
   gpupool ``x-gpupool-queue-timeout: 3600``: a request that finds no room waits at the gateway (as
   it waits in an engine's queue behind the other routers) instead of taking a 429, and that wait
   is part of its TTFT.
5. Figures per router from the instances' vLLM metrics, summed: ``prefix_hit_rate`` (GPU + host-tier
   hit tokens / queried prompt tokens), ``gpu_hit_rate``, ``host_hit_rate``, ``recomputed_prompt_
   tokens``, ``engine_preemptions``, ``host_tier_loaded_bytes`` / ``host_tier_stored_bytes``; from
   the client: ``ttft_p50_ms`` / ``ttft_p99_ms`` (trace time; 200 answers only), ``served`` (200),
   ``shed`` (429), ``failed`` (anything else); gpupool adds ``red_line_hits``, ``prefix_routed`` and
   ``reclaimed_prefixes``. A router that cannot start is reported ``"available": false`` with the
   reason; nothing is estimated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpupool.bench.httpload import env_unbuffered, exit_on_sigterm, stop, wait_http
from gpupool.bench.proxy_peers_bench import ensure_peers
from gpupool.cli.serving import free_port
from gpupool.hardware.memory import resolve_model

MODEL = "qwen2.5-14b"
GPU = "A100-SXM4-80GB"
SLICE = "whole A100-SXM4-80GB"
SLICE_VRAM_MIB = 81920
COMPUTE_FRACTION = 1.0
BLOCK_TOKENS = 512
TOKEN = "bench-kv-token-0001"
ROUTERS = ("round-robin", "vllm-router-cache-aware", "gpupool")
MIN_SESSION_BLOCKS = 2
RECORD_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
GPUPOOL_HEADERS = {"x-gpupool-queue-timeout": "3600"}
"""The client waits for room rather than take a 429 (as it waits in the engines' queues behind the
other routers); queue time counts in its TTFT."""


def _log(msg: str) -> None:
    print(f"[kv {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- the trace
def load_trace(path: Path, *, limit: int | None = None, arrival: str = "as-is") -> list[dict[str, Any]]:
    """The first ``limit`` requests, validated, in time order (a file's rows need not be), with
    ``arrival`` applied ("as-is" or "burst:S")."""
    out: list[dict[str, Any]] = []
    max_tokens = resolve_model(MODEL).max_positions
    with path.open(encoding="utf-8-sig") as f:  # -sig: a byte-order mark is no part of the first record
        try:
            for n, line in enumerate(f, 1):
                if limit is not None and len(out) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON record ({exc})") from None
                _check_record(path, n, r)
                _check_lengths(path, n, r, max_tokens)
                out.append(r)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not out:
        raise ValueError(f"{path}: no requests")
    out.sort(key=lambda r: r["timestamp"])  # (stable) the replay times each request from the first
    kind, value = parse_arrival(arrival)
    if kind == "stretch":
        return [{**r, "timestamp": int(r["timestamp"] * value)} for r in out]
    if kind == "burst":
        window_ms = int(value * 1000)
        out = [{**r, "timestamp": r["timestamp"] // window_ms * window_ms} for r in out]
    return out


def _check_record(path: Path, n: int, r: Any) -> None:
    """A JSON object with non-negative integer ``timestamp``, ``input_length`` and ``output_length``
    and a list of integer ``hash_ids`` (other keys are ignored); `ValueError` names the field."""
    if not isinstance(r, dict):
        raise ValueError(f"{path}:{n}: expected a JSON object with {', '.join(RECORD_FIELDS)}")
    for k in RECORD_FIELDS:
        if k not in r:
            raise ValueError(f"{path}:{n}: no field {k}")
    for k in RECORD_FIELDS[:3]:
        if type(r[k]) is not int or r[k] < 0:
            raise ValueError(f"{path}:{n}: field {k}={r[k]!r} is not an integer >= 0")
    if not isinstance(r["hash_ids"], list) or not all(type(h) is int for h in r["hash_ids"]):
        raise ValueError(f"{path}:{n}: field hash_ids is not a list of integers")


def _check_lengths(path: Path, n: int, r: dict[str, Any], limit: int) -> None:
    """A request the replay can send: prompt + output within the model's context (``limit``
    tokens), and no more hash ids than the prompt has 512-token blocks (the trace's own rule; longer
    lists would only cost the session matching time quadratic in their length)."""
    total = r["input_length"] + r["output_length"]
    if total > limit:
        raise ValueError(
            f"{path}:{n}: input_length + output_length = {total} exceeds {MODEL}'s context of {limit} tokens"
        )
    blocks = -(-r["input_length"] // BLOCK_TOKENS)
    if len(r["hash_ids"]) > blocks:
        raise ValueError(
            f"{path}:{n}: {len(r['hash_ids'])} hash_ids for input_length {r['input_length']} "
            f"(at most {blocks}: one per {BLOCK_TOKENS}-token block)"
        )


ARRIVAL_FORMS = "expected as-is, burst:SECONDS (>= 0.001) or stretch:FACTOR (> 0), finite"


def parse_arrival(arrival: str) -> tuple[str, float]:
    """``as-is`` -> ("as-is", 0); ``burst:S`` / ``stretch:F`` -> (kind, S or F). `ValueError` naming
    ``arrival`` for anything else, a window under 1 ms, a factor <= 0, NaN or infinity."""
    if arrival == "as-is":
        return "as-is", 0.0
    kind, _, num = arrival.partition(":")
    try:
        value = float(num)
    except ValueError:
        value = float("nan")
    least = 0.001 if kind == "burst" else 0.0
    if kind not in ("burst", "stretch") or not (least <= value < float("inf") and value > 0):
        raise ValueError(f"arrival {arrival!r}: {ARRIVAL_FORMS}")
    return kind, value


def derive_sessions(trace: list[dict[str, Any]]) -> list[str]:
    """A session id per request: that of the earlier request sharing its longest prefix (>= 2 blocks)."""
    owner: dict[tuple[int, ...], str] = {}
    out: list[str] = []
    for i, r in enumerate(trace):
        ids = tuple(r["hash_ids"])
        sid = ""
        for k in range(len(ids), MIN_SESSION_BLOCKS - 1, -1):
            sid = owner.get(ids[:k], "")
            if sid:
                break
        sid = sid or f"s{i}"
        for k in range(MIN_SESSION_BLOCKS, len(ids) + 1):
            owner.setdefault(ids[:k], sid)
        out.append(sid)
    return out


def _word(h: int, i: int) -> str:
    """Three letters: with its leading space one emulated token of four characters, as English text
    averages about four characters a token (the gateway's characters / 4 estimate holds)."""
    n = (h * 1_000_003 + i * 7919) % (26**3)
    chars = []
    for _ in range(3):
        n, rem = divmod(n, 26)
        chars.append(chr(97 + rem))
    return "".join(chars)


_BLOCKS: dict[int, str] = {}


def _block(h: int) -> str:
    """The text of hash id ``h``'s full 512-token block (cached: ids recur across a session)."""
    text = _BLOCKS.get(h)
    if text is None:
        text = "".join(" " + _word(h, i) for i in range(BLOCK_TOKENS))
        if len(_BLOCKS) < 200_000:
            _BLOCKS[h] = text
    return text


def render(hash_ids: list[int], input_length: int) -> str:
    """Text of ``input_length`` emulated tokens (+ BOS) whose 512-token blocks follow ``hash_ids``."""
    parts: list[str] = []
    left = max(1, input_length)
    for h in hash_ids:
        n = min(BLOCK_TOKENS, left)
        parts.append(_block(h) if n == BLOCK_TOKENS else _block(h)[: 4 * n])  # 4 characters a token
        left -= n
        if left <= 0:
            break
    parts.extend(" " + _word(-1, i) for i in range(left))
    return "".join(parts)


# ---------------------------------------------------------------------- the servers (own processes)
def _listen_and_report(port_file: Path) -> socket.socket:
    """A listening socket on a port the kernel picks, its number written to ``port_file`` (whole, by
    rename). The server binds it itself: a port picked by the parent and closed before the child
    binds it can be handed out twice, and a second server on a taken port fails to bind while the
    first answers its health checks, so one engine silently served two instances' traffic."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(sock.getsockname()[1]))
    tmp.replace(port_file)
    return sock


def _uvicorn_on(app: Any, sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def serve_backend(port_file: Path, speed: float, host_tier_mib: int, stream_interval: int = 1) -> None:
    from gpupool.adapters.backends import EmulatedEngine, Roofline, gpu_peaks, pcie_bytes_s
    from gpupool.adapters.backends.app import create_backend_app
    from gpupool.cli.serve import KvSizer
    from gpupool.hardware.memory import QUANT_BYTES, kv_bytes_per_token_of

    arch = resolve_model(MODEL)
    bw, flops = gpu_peaks(GPU)
    roof = Roofline(
        params=arch.param_count,
        bytes_per_param=QUANT_BYTES["bf16"],
        kv_bytes_per_token=kv_bytes_per_token_of(arch),
        mem_bw_bytes_s=bw,
        peak_flops=flops,
        compute_fraction=COMPUTE_FRACTION,
    )
    engine = EmulatedEngine(
        roof,
        kv_budget_mib=KvSizer().kv_budget_mib(MODEL, SLICE_VRAM_MIB),
        speed=speed,
        host_tier_mib=host_tier_mib,
        pcie_bytes_s=pcie_bytes_s(GPU),
        stream_interval=stream_interval,
    )
    app = create_backend_app(engine, model=MODEL, max_model_len=arch.max_positions)
    _uvicorn_on(app, _listen_and_report(port_file))


def serve_gateway(port_file: Path, backends: list[str], host_tier_mib: int) -> None:
    from fastapi.responses import JSONResponse

    from gpupool.adapters.http.app import create_app
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.adapters.store import MemoryLeaseStore
    from gpupool.cli.demo import seed_example_pool
    from gpupool.cli.leaseclock import lease_clock
    from gpupool.cli.serve import KvSizer
    from gpupool.core.controller import KV_PREFIX, ControllerConfig, LeaseController
    from gpupool.core.ports import Backend
    from gpupool.core.sessions import DEFAULT_RED_LINE_PCT

    sizer = KvSizer()
    budget = sizer.kv_budget_mib(MODEL, SLICE_VRAM_MIB)
    c = LeaseController(
        seed_example_pool(),
        clock=lease_clock(),
        store=MemoryLeaseStore(),
        config=ControllerConfig(kv_red_line_pct=DEFAULT_RED_LINE_PCT),
    )
    for i, url in enumerate(backends):
        c.register_backend(Backend(f"i{i}", MODEL, url, node="gpu-c", gpu_id="gpu-c/0", kv_budget_mib=budget))
        c.sessions.set_host_tier(f"{KV_PREFIX}i{i}", host_tier_mib)  # the engines' host tier
    app = create_app(c, tokens=TokenTable([(TOKEN, "bench", "tenant")]), sizer=sizer)
    sessions = app.state.sessions

    async def stats() -> JSONResponse:
        return JSONResponse(
            {
                "red_line_hits": sessions.red_line_hits,
                "prefix_routed": sessions.prefix_routed,
                "reclaimed_prefixes": sessions.reclaimed,
            }
        )

    app.add_api_route("/bench/sessions", stats, methods=["GET"])
    _uvicorn_on(app, _listen_and_report(port_file))


def _spawn(args: list[str], log: Any) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpupool.bench.kv_bench", *args]
    return subprocess.Popen(cmd, env=env_unbuffered(), stdout=log, stderr=subprocess.STDOUT)


def _reported_url(port_file: Path, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> str:
    """The URL of the server ``proc`` started, once it wrote its port to ``port_file``."""
    deadline = time.monotonic() + timeout_s
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen within {timeout_s:.0f} s")
        time.sleep(0.05)
    return f"http://127.0.0.1:{int(port_file.read_text())}"


def start_servers(
    role: str,
    args_each: list[list[str]],
    tmp: Path,
    log: Any,
    procs: list[subprocess.Popen[bytes]],
    *,
    timeout_s: float,
    health: str,
) -> list[str]:
    """Start one server (``role``: backend | gateway) per argument list, each on a port it binds
    itself, and wait until every one answers ``health``; their processes are appended to ``procs``
    (the caller stops them). The URLs are distinct: each names a socket its own process holds."""
    files = []
    for args in args_each:
        f = tmp / f"{role}-{len(procs)}.port"
        f.unlink(missing_ok=True)
        procs.append(_spawn([role, "--port-file", str(f), *args], log))
        files.append((f, procs[-1]))
    urls = [_reported_url(f, p, timeout_s, f"{role} {i}") for i, (f, p) in enumerate(files)]
    for u, (_, p) in zip(urls, files, strict=True):
        wait_http(u + health, p, timeout_s=timeout_s, what=role)
    return urls


# ---------------------------------------------------------------------- replay and metrics
async def _replay(
    trace: list[dict[str, Any]],
    sessions: list[str],
    urls: list[str],
    headers: dict[str, str],
    *,
    scale: float,
    session_header: bool,
) -> tuple[list[float], dict[str, int]]:
    import httpx

    ttfts: list[float] = []
    statuses: dict[str, int] = {}
    t0 = time.monotonic() + 0.5
    base = trace[0]["timestamp"] if trace else 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)

    async def one(i: int, r: dict[str, Any], cl: httpx.AsyncClient) -> None:
        await asyncio.sleep(max(0.0, t0 + (r["timestamp"] - base) / 1000 / scale - time.monotonic()))
        body = {
            "model": MODEL,
            "prompt": render(r["hash_ids"], r["input_length"]),
            "max_tokens": max(1, r["output_length"]),
            "stream": True,
        }
        h = {**headers, "x-gpupool-session": sessions[i], **GPUPOOL_HEADERS} if session_header else headers
        start = time.monotonic()
        first: float | None = None
        status = 0
        try:
            async with cl.stream(
                "POST", urls[i % len(urls)] + "/v1/completions", json=body, headers=h
            ) as resp:
                status = resp.status_code
                async for chunk in resp.aiter_raw():
                    if first is None and chunk:
                        first = time.monotonic() - start
        except httpx.HTTPError:
            status = 0
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        if status == 200 and first is not None:
            ttfts.append(first * scale * 1000)

    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as cl:
        await asyncio.gather(*(one(i, r, cl) for i, r in enumerate(trace)))
    return ttfts, statuses


def _scrape(urls: list[str]) -> dict[str, float]:
    import urllib.request

    want = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "gpu_hits",
        "vllm:external_prefix_cache_hits_total": "host_hits",
        "vllm:num_preemptions_total": "preemptions",
        "gpupool:kv_host_tier_loaded_bytes_total": "host_loaded",
        "gpupool:kv_host_tier_stored_bytes_total": "host_stored",
    }
    out = dict.fromkeys(want.values(), 0.0)
    out["recomputed"] = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name_lab, value = line.rsplit(" ", 1)
            name = name_lab.split("{", 1)[0]
            if name in want:
                out[want[name]] += float(value)
            elif name == "vllm:prompt_tokens_by_source_total" and 'source="local_compute"' in name_lab:
                out["recomputed"] += float(value)
    return out


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))], 1)


def run(
    *,
    trace_path: Path,
    limit: int | None = None,
    instances: int = 4,
    time_scale: float = 10.0,
    arrival: str = "as-is",
    host_tier_mib: int = 65536,
    stream_interval: int = 16,
    routers: tuple[str, ...] = ROUTERS,
    peers_venv: Path = Path(".gpupool/peers-venv"),
    install_peers: bool = True,
    start_timeout_s: float = 120.0,
) -> dict[str, Any]:
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        raise ValueError(f"unknown router(s) {unknown}; known: {list(ROUTERS)}")
    trace = load_trace(trace_path, limit=limit, arrival=arrival)
    sessions = derive_sessions(trace)
    peers_venv = peers_venv.resolve()
    reasons: dict[str, str | None] = {}
    if "vllm-router-cache-aware" in routers:
        reasons["vllm-router-cache-aware"] = ensure_peers(peers_venv, install=install_peers)["vllm-router"]
    from gpupool.cli.serve import KvSizer

    exit_on_sigterm()
    load0 = os.getloadavg()
    wall0 = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpupool-kv-") as tmp_s:
        tmp = Path(tmp_s)
        for router in routers:
            if reasons.get(router):
                results[router] = {"available": False, "reason": reasons[router]}
                continue
            procs: list[subprocess.Popen[bytes]] = []
            try:
                log = (tmp / f"{router}.log").open("wb")
                each = [
                    "--speed",
                    str(time_scale),
                    "--host-tier-mib",
                    str(host_tier_mib),
                    "--stream-interval",
                    str(stream_interval),
                ]
                urls = start_servers(
                    "backend",
                    [each] * instances,
                    tmp,
                    log,
                    procs,
                    timeout_s=start_timeout_s,
                    health="/health",
                )
                targets, headers = urls, {"content-type": "application/json"}
                gw = ""
                if router == "vllm-router-cache-aware":
                    port = free_port()
                    cmd = [
                        str(peers_venv / "bin" / "vllm-router"),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                    ]
                    cmd += ["--worker-urls", *urls, "--policy", "cache_aware", "--log-level", "warning"]
                    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
                    procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
                    gw = f"http://127.0.0.1:{port}"
                    wait_http(gw + "/health", procs[-1], timeout_s=start_timeout_s, what=router)
                elif router == "gpupool":
                    gw_args = ["--host-tier-mib", str(host_tier_mib), *urls]
                    gw = start_servers(
                        "gateway", [gw_args], tmp, log, procs, timeout_s=start_timeout_s, health="/healthz"
                    )[0]
                    headers = {**headers, "authorization": f"Bearer {TOKEN}"}
                if gw:
                    targets = [gw]
                _log(f"{router}: replaying {len(trace)} requests at {time_scale}x on {instances} instances")
                t = time.monotonic()
                ttfts, statuses = asyncio.run(
                    _replay(
                        trace,
                        sessions,
                        targets,
                        headers,
                        scale=time_scale,
                        session_header=router == "gpupool",
                    )
                )
                m = _scrape(urls)
                q = max(1.0, m["queries"])
                row: dict[str, Any] = {
                    "available": True,
                    "prefix_hit_rate": round((m["gpu_hits"] + m["host_hits"]) / q, 4),
                    "gpu_hit_rate": round(m["gpu_hits"] / q, 4),
                    "host_hit_rate": round(m["host_hits"] / q, 4),
                    "recomputed_prompt_tokens": int(m["recomputed"]),
                    "ttft_p50_ms": _pct(ttfts, 50),
                    "ttft_p99_ms": _pct(ttfts, 99),
                    "engine_preemptions": int(m["preemptions"]),
                    "host_tier_loaded_bytes": int(m["host_loaded"]),
                    "host_tier_stored_bytes": int(m["host_stored"]),
                    "served": statuses.get("200", 0),
                    "shed": statuses.get("429", 0),
                    "failed": sum(v for k, v in statuses.items() if k not in {"200", "429"}),
                    "wall_s": round(time.monotonic() - t, 1),
                }
                if router == "gpupool":
                    import urllib.request

                    with urllib.request.urlopen(gw + "/bench/sessions", timeout=10) as resp:
                        row.update(json.loads(resp.read()))
                results[router] = row
                _log(f"{router}: {row}")
            except RuntimeError as exc:
                tail = (tmp / f"{router}.log").read_text(errors="replace").strip().splitlines()[-3:]
                results[router] = {
                    "available": False,
                    "reason": f"{exc}; last output: {' | '.join(tail) or 'none'}",
                }
            finally:
                stop(procs[::-1])
    return {
        "benchmark": "kv",
        "trace": trace_path.name,
        "requests": len(trace),
        "sessions": len(set(sessions)),
        "arrival": arrival,
        "time_scale": time_scale,
        "instances": instances,
        "instance": f"{MODEL} on a {SLICE}, KV budget {KvSizer().kv_budget_mib(MODEL, SLICE_VRAM_MIB)} MiB, "
        f"host tier {host_tier_mib} MiB",
        "wall_s": round(time.monotonic() - wall0, 1),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "routers": results,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="gpupool.bench.kv_bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("backend")
    b.add_argument("--port-file", type=Path, required=True)
    b.add_argument("--speed", type=float, required=True)
    b.add_argument("--host-tier-mib", type=int, required=True)
    b.add_argument("--stream-interval", type=int, default=1)
    g = sub.add_parser("gateway")
    g.add_argument("--port-file", type=Path, required=True)
    g.add_argument("--host-tier-mib", type=int, required=True)
    g.add_argument("backends", nargs="+")
    a = p.parse_args(argv)
    exit_on_sigterm()
    if a.cmd == "backend":
        serve_backend(a.port_file, a.speed, a.host_tier_mib, a.stream_interval)
    else:
        serve_gateway(a.port_file, a.backends, a.host_tier_mib)


if __name__ == "__main__":
    main()
