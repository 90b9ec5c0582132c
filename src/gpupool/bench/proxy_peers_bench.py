"""`gpupool bench proxy-peers`: the OpenAI proxy against the proxies a user would pick instead.

Method (one run, one emulated backend, four targets, same load generator):
1. One emulated backend (``gpupool emulate-backend --model qwen2.5-0.5b --speed 1000``) in its own
   process. Targets, each its own process in front of that backend:
   - ``direct``: the backend itself (the floor);
   - ``gpupool``: a real ``gpupool serve`` subprocess (bearer auth, priority parsing, a KV-cache
     request lease acquired and released per request, the backend registered from a ``--backends``
     file);
   - ``vllm-router``: vLLM's Rust router (PyPI ``vllm-router``, ``--policy round_robin``);
   - ``litellm``: LiteLLM proxy (PyPI ``litellm[proxy]``, one worker, ``hosted_vllm/`` model entry).
   The peers are installed on demand into their own venv (``--peers-venv``, default
   ``.gpupool/peers-venv``), never into gpupool's environment. A peer that cannot be installed or
   started is reported ``"available": false`` with the reason; nothing is ever estimated for it.
2. Load: raw asyncio HTTP/1.1 keep-alive clients in this process POST ``/v1/completions``
   (``{"model", "prompt": "hello", "max_tokens": 1}``) back to back. Per target and per round: a
   1-client phase (latency) and a ``clients``-client phase (throughput), each after a warm-up.
   With ``rounds > 1`` the targets are measured in turn, round after round (so slow drifts of the
   shared machine hit every target alike), and each figure is the median over rounds.

JSON (one object): ``benchmark``, ``model``, ``clients``, ``duration_s``, ``rounds``, ``cpus``, and
``targets``: ``{name: {...}}`` in the order above, each with
- ``available`` (bool), and ``reason`` (str) when false;
- ``p50_ms``, ``p99_ms``: latency of one request at 1 client (ms, median over rounds);
- ``added_p50_ms``: ``p50_ms`` minus direct's ``p50_ms`` (the proxy's added median latency);
- ``requests_per_s``: 200 answers per second at ``clients`` clients;
- ``p50_ms_at_clients``: median latency at ``clients`` clients;
- ``cpu_us_per_request``: CPU (user + system, the target's process tree; for ``direct`` the
  backend's) per answer in the ``clients``-client phase: the figure that moves least with the other
  jobs on a shared machine (Linux ``/proc``; null elsewhere);
- ``ok`` / ``non_200`` / ``non_200_by_status``: answers counted over all phases and rounds (status
  ``0`` = the connection was closed); a target with non-200 answers is not a fair comparison;
- ``version``: the installed package version (peers) or ``null``.
Progress goes to stderr, one line per phase.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.bench.httpload import (
    LoadResult,
    env_unbuffered,
    exit_on_sigterm,
    post_loop,
    runner,
    stop,
    tree_cpu_s,
    wait_http,
)
from gpupool.cli.serving import free_port

MODEL = "qwen2.5-0.5b"
TOKEN = "bench-tenant-token-0001"
LITELLM_KEY = "sk-bench-master-key"
PEERS = {"vllm-router": "vllm-router==0.1.17", "litellm": "litellm[proxy]==1.108.7"}
TARGETS = ("direct", "gpupool", "vllm-router", "litellm")
CLUSTER_YAML = "nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n"
WORKLOADS_YAML = (
    f"workloads:\n  - name: llm\n    model: {MODEL}\n    priority: P1\n    replicas: 1\n    isolation: any\n"
)


def _log(msg: str) -> None:
    print(f"[proxy-peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- peers venv
def ensure_peers(venv: Path, *, install: bool) -> dict[str, str | None]:
    """{peer: None if its command is there, else the reason it is not}. Installs when asked."""
    bins = {"vllm-router": venv / "bin" / "vllm-router", "litellm": venv / "bin" / "litellm"}
    missing = [p for p, b in bins.items() if not b.exists()]
    if missing and install:
        try:
            if not (venv / "bin" / "python").exists():
                _log(f"creating the peers venv {venv}")
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
            for p in missing:
                _log(f"installing {PEERS[p]} into {venv} (once)")
                r = subprocess.run(
                    [str(venv / "bin" / "pip"), "install", "-q", PEERS[p]],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    check=False,
                )
                if r.returncode != 0:
                    tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
                    _log(f"{PEERS[p]}: pip failed: {tail[0]}")
        except (OSError, subprocess.SubprocessError) as exc:
            _log(f"cannot prepare the peers venv: {exc}")
    out: dict[str, str | None] = {}
    for p, b in bins.items():
        if b.exists():
            out[p] = None
        elif install:
            out[p] = f"`pip install {PEERS[p]}` into {venv} failed (no {b.name} command)"
        else:
            out[p] = f"not installed in {venv} and installation was not requested"
    return out


def _peer_version(venv: Path, dist: str) -> str | None:
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() or None if r.returncode == 0 else None


# ---------------------------------------------------------------------- starting the targets
def _start_backend(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "gpupool.cli.main", "emulate-backend", "--model", MODEL, "--port", str(port)]
    cmd += ["--gpu", "H100-SXM5-80GB", "--speed", "1000", "--kv-budget-mib", "65536"]
    return subprocess.Popen(cmd, env=env_unbuffered(), stdout=subprocess.DEVNULL)


def _start_gpupool(port: int, backend: str, tmp: Path, log: Any) -> subprocess.Popen[bytes]:
    (tmp / "cluster.yaml").write_text(CLUSTER_YAML)
    (tmp / "workloads.yaml").write_text(WORKLOADS_YAML)
    (tmp / "auth.yaml").write_text(f"tokens:\n  - {{token: {TOKEN}, tenant: bench, role: tenant}}\n")
    (tmp / "backends.yaml").write_text(
        f"backends:\n  - {{id: b0, model: {MODEL}, url: '{backend}', slice_id: n0/0/mps-llm-0}}\n"
    )
    cmd = [sys.executable, "-m", "gpupool.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--data-dir", str(tmp / "data"), "--cluster", str(tmp / "cluster.yaml")]
    cmd += ["--workloads", str(tmp / "workloads.yaml"), "--auth-file", str(tmp / "auth.yaml")]
    cmd += ["--backends", str(tmp / "backends.yaml")]
    cmd += os.environ.get("GPUPOOL_BENCH_SERVE_ARGS", "").split()
    return subprocess.Popen(cmd, env=env_unbuffered(), stdout=log, stderr=subprocess.STDOUT)


def _start_router(venv: Path, port: int, backend: str, log: Any) -> subprocess.Popen[bytes]:
    cmd = [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--worker-urls", backend, "--policy", "round_robin", "--log-level", "warning"]
    # its Prometheus exporter binds a fixed default port otherwise (a second router would fail)
    cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _start_litellm(venv: Path, port: int, backend: str, tmp: Path, log: Any) -> subprocess.Popen[bytes]:
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: hosted_vllm/{MODEL}\n"
        f"      api_base: {backend}/v1\n"
        "      api_key: x\n"
    )
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    cmd = [str(venv / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--num_workers", "1"]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)


# ---------------------------------------------------------------------- the run
def run(
    *,
    clients: int = 8,
    duration_s: float = 5.0,
    warmup_s: float = 1.0,
    rounds: int = 1,
    targets: tuple[str, ...] = TARGETS,
    peers_venv: Path = Path(".gpupool/peers-venv"),
    install_peers: bool = True,
    start_timeout_s: float = 300.0,
) -> dict[str, Any]:
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown target(s) {unknown}; known: {list(TARGETS)}")
    peers_venv = peers_venv.resolve()
    reasons: dict[str, str | None] = {"direct": None, "gpupool": None}
    wanted_peers = [t for t in targets if t in PEERS]
    if wanted_peers:
        reasons.update(ensure_peers(peers_venv, install=install_peers))
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 1}).encode()
    headers: dict[str, dict[str, str]] = {
        "direct": {"Content-Type": "application/json"},
        "gpupool": {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
        "vllm-router": {"Content-Type": "application/json"},
        "litellm": {"Content-Type": "application/json", "Authorization": f"Bearer {LITELLM_KEY}"},
    }
    procs: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    pids: dict[str, int] = {}
    cpu_us: dict[str, list[float]] = {t: [] for t in targets}
    one: dict[str, list[LoadResult]] = {t: [] for t in targets}
    many: dict[str, list[LoadResult]] = {t: [] for t in targets}
    run_ = runner()
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="gpupool-peers-") as tmp_s:
        tmp = Path(tmp_s)
        try:
            bport = free_port()
            backend_url = f"http://127.0.0.1:{bport}"
            _log(f"starting the emulated backend ({MODEL}) on {backend_url}")
            procs.append(_start_backend(bport))
            wait_http(f"{backend_url}/health", procs[-1], what="emulated backend")
            ports["direct"] = bport
            pids["direct"] = procs[-1].pid
            starters: dict[str, Callable[[int, Any], subprocess.Popen[bytes]]] = {
                "gpupool": lambda p, log: _start_gpupool(p, backend_url, tmp, log),
                "vllm-router": lambda p, log: _start_router(peers_venv, p, backend_url, log),
                "litellm": lambda p, log: _start_litellm(peers_venv, p, backend_url, tmp, log),
            }
            for t in targets:
                if t == "direct" or reasons.get(t):
                    continue
                port = free_port()
                _log(f"starting {t} on port {port}")
                log = (tmp / f"{t}.log").open("wb")
                procs.append(starters[t](port, log))
                try:
                    health = {"gpupool": "/healthz", "litellm": "/health/liveliness"}.get(t, "/health")
                    wait_http(
                        f"http://127.0.0.1:{port}{health}", procs[-1], timeout_s=start_timeout_s, what=t
                    )
                    ports[t] = port
                    pids[t] = procs[-1].pid
                except RuntimeError as exc:
                    tail = (tmp / f"{t}.log").read_text(errors="replace").strip().splitlines()[-3:]
                    reasons[t] = f"{exc}; last output: {' | '.join(tail) or 'none'}"
                    _log(f"{t} unavailable: {reasons[t]}")
            live = [t for t in targets if t in ports]
            for r in range(rounds):
                for t in live:
                    for n, bucket in ((1, one), (clients, many)):
                        cpu0 = tree_cpu_s(pids[t])
                        res = run_(
                            post_loop(
                                ports[t],
                                "/v1/completions",
                                body,
                                headers[t],
                                clients=n,
                                duration_s=duration_s,
                                warmup_s=warmup_s,
                            )
                        )
                        bucket[t].append(res)
                        cpu1 = tree_cpu_s(pids[t])
                        if n == clients and cpu0 is not None and cpu1 is not None and res.ok:
                            # the CPU covers the warm-up too: divide by every answer of the phase
                            cpu_us[t].append((cpu1 - cpu0) * 1e6 / max(1, res.answers_with_warmup))
                        s = res.summary()
                        _log(
                            f"round {r + 1}/{rounds} {t:<11} {n:>2} client(s): {s['requests_per_s']:>8} req/s"
                            f"  p50 {s['p50_ms']} ms  p99 {s['p99_ms']} ms  non-200 {s['non_200']}"
                        )
        finally:
            stop(procs[::-1])
    out_targets: dict[str, Any] = {}
    direct_p50 = _median_of(one.get("direct", []), "p50_ms")
    for t in targets:
        if t not in ports:
            out_targets[t] = {"available": False, "reason": reasons.get(t) or "did not start"}
            continue
        statuses: dict[str, int] = {}
        ok = 0
        for res in one[t] + many[t]:
            ok += res.ok
            for k, v in res.summary()["non_200_by_status"].items():
                statuses[k] = statuses.get(k, 0) + v
        p50 = _median_of(one[t], "p50_ms")
        out_targets[t] = {
            "available": True,
            "p50_ms": p50,
            "p99_ms": _median_of(one[t], "p99_ms"),
            "added_p50_ms": round(p50 - direct_p50, 3)
            if p50 is not None and direct_p50 is not None
            else None,
            "requests_per_s": _median_of(many[t], "requests_per_s"),
            "p50_ms_at_clients": _median_of(many[t], "p50_ms"),
            "cpu_us_per_request": round(statistics.median(cpu_us[t])) if cpu_us[t] else None,
            "ok": ok,
            "non_200": sum(statuses.values()),
            "non_200_by_status": statuses,
            "version": _peer_version(peers_venv, PEERS[t].split("[")[0].split("=")[0])
            if t in PEERS
            else None,
        }
    return {
        "benchmark": "proxy-peers",
        "model": MODEL,
        "request": "POST /v1/completions max_tokens=1",
        "clients": clients,
        "duration_s": duration_s,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "targets": out_targets,
    }


def _median_of(results: list[LoadResult], key: str) -> float | None:
    """Median over rounds; None when no phase produced a sample (never NaN: the output is JSON)."""
    vals = [v for v in (r.summary()[key] for r in results) if not math.isnan(v)]
    return round(statistics.median(vals), 3) if vals else None


if __name__ == "__main__":
    print(json.dumps(run()))
