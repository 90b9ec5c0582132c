"""`gpupool bench replicas`: the OpenAI proxy scaled out across 1, 2, 4 proxy replicas
(`gpupool proxy`), measured with real processes, then in the simulator driven by the same core code
(`gpupool.sim.replicas`) for what the machine's cores cannot show.

Method (measured part): ``backends`` emulated backends (``gpupool emulate-backend --speed 1000``,
model qwen2.5-0.5b; default 2), one leader (``gpupool serve`` with all registered as instances of
the model), and for each replica count N: N ``gpupool proxy`` processes (share TTL 3 s),
``clients`` raw asyncio keep-alive clients spread evenly over the replicas (in this process, or in
``load_procs`` spawned load-generator processes), each POSTing
``/v1/completions`` (``max_tokens`` 1) back to back for a warm-up and then ``duration_s``. Every
answer is counted by status. CPU per answer is read from ``/proc`` for the replicas, the leader and
the backends over the measured phase.

JSON (one object): ``benchmark``, ``cpus``, ``load_1m`` (before the run), ``clients``,
``duration_s``, ``backends``, ``load_procs``, and
- ``measured``: ``{"leader" | N: {"requests_per_s", "p50_ms", "p99_ms", "ok", "non_200",
  "non_200_by_status", "leader_share_calls_per_s", "leader_calls_per_request",
  "cpu_us_per_request": {"replicas", "leader", "backends"}}}``; ``"leader"``: the same load through
  the leader's own proxy, no replica (the baseline);
- ``sim``: ``{"inputs": {"proxy_cpu_us", "leader_call_us", ...}, "ample": {N: {...}}, "tight":
  {N: {...}}}``: `gpupool.sim.replicas.run` per N, with the replica CPU per request measured above
  at N = 1 (or ``--sim-proxy-cpu-us``) and the leader's cost per share call measured on the real
  `ShareDelegator`; ``ample``: KV budgets never bind; ``tight``: one backend whose budget binds from
  2 replicas on (throughput then stops at what the budget carries, shares never exceed it).
Progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
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
ADMIN = "bench-admin-token-0001"
SHARE_TTL_S = 3.0
BACKENDS = 2
PATH = "/v1/completions"


def _log(msg: str) -> None:
    print(f"[replicas {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _gpupool(args: list[str], log: Any) -> subprocess.Popen[bytes]:
    env = env_unbuffered() | {"GPUPOOL_LEADER_TOKEN": ADMIN}
    cmd = [sys.executable, "-m", "gpupool.cli.main", *args]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _files(tmp: Path, backend_ports: list[int]) -> list[str]:
    n = len(backend_ports)
    (tmp / "cluster.yaml").write_text("nodes:\n  - name: n0\n    gpus: [{model: H100-SXM5-80GB, count: 1}]\n")
    (tmp / "workloads.yaml").write_text(
        f"workloads:\n  - {{name: llm, model: {MODEL}, priority: P1, replicas: {n}, isolation: any}}\n"
    )
    (tmp / "auth.yaml").write_text(
        f"tokens:\n  - {{token: {TOKEN}, tenant: bench, role: tenant}}\n"
        f"  - {{token: {ADMIN}, tenant: ops, role: admin}}\n"
    )
    lines = "".join(
        f"  - {{id: b{i}, model: {MODEL}, url: 'http://127.0.0.1:{p}', slice_id: n0/0/mps-llm-{i}}}\n"
        for i, p in enumerate(backend_ports)
    )
    (tmp / "backends.yaml").write_text("backends:\n" + lines)
    return ["--auth-file", str(tmp / "auth.yaml"), "--workloads", str(tmp / "workloads.yaml")]


def _share_calls(port: int) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/kv/shares", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(json.loads(r.read())["calls"])


def _cpu(pids: list[int]) -> float:
    return sum(tree_cpu_s(p) or 0.0 for p in pids)


def _phase(ports: list[int], clients: int, duration_s: float, warmup_s: float, procs: int = 1) -> LoadResult:
    """``clients`` spread evenly over ``ports``; with ``procs`` > 1 the clients run in that many
    load-generator processes (one Python process saturates one core long before many replicas do)."""
    each = [clients // len(ports) + (1 if i < clients % len(ports) else 0) for i in range(len(ports))]
    work = [(p, c) for p, c in zip(ports, each, strict=True) if c]
    if procs <= 1:
        return _load(work, duration_s, warmup_s)
    # deal the (port, clients) pairs out to the processes client by client, round robin
    shares: list[dict[int, int]] = [{} for _ in range(procs)]
    k = 0
    for p, c in work:
        for _ in range(c):
            shares[k % procs][p] = shares[k % procs].get(p, 0) + 1
            k += 1
    import multiprocessing

    # spawn, not fork: this process runs threads (log readers of the servers it started), and a child
    # forked while one of them holds a lock can hang forever (seen once in CI)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        parts = pool.starmap(_load, [(sorted(x.items()), duration_s, warmup_s) for x in shares if x])
    out = LoadResult(duration_s=duration_s)
    for r in parts:
        out.latencies_s += r.latencies_s
        out.statuses.update(r.statuses)
        out.answers_with_warmup += r.answers_with_warmup
    return out


def _load(work: list[tuple[int, int]], duration_s: float, warmup_s: float) -> LoadResult:
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 1}).encode()
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

    async def go() -> list[LoadResult]:
        return await asyncio.gather(
            *(
                post_loop(p, PATH, body, headers, clients=c, duration_s=duration_s, warmup_s=warmup_s)
                for p, c in work
            )
        )

    parts: list[LoadResult] = runner()(go())
    out = LoadResult(duration_s=duration_s)
    for r in parts:
        out.latencies_s += r.latencies_s
        out.statuses.update(r.statuses)
        out.answers_with_warmup += r.answers_with_warmup
    return out


def run(
    *,
    replicas: tuple[int, ...] = (1, 2, 4),
    clients: int = 16,
    duration_s: float = 5.0,
    warmup_s: float = 1.0,
    sim_proxy_cpu_us: float | None = None,
    sim_only: bool = False,
    backends: int = BACKENDS,
    load_procs: int = 1,
) -> dict[str, Any]:
    exit_on_sigterm()
    from gpupool.sim.replicas import SimConfig, measure_leader_call_us
    from gpupool.sim.replicas import run as sim_run

    out: dict[str, Any] = {
        "benchmark": "replicas",
        "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
        "clients": clients,
        "duration_s": duration_s,
        "backends": backends,
        "load_procs": load_procs,
        "measured": {},
    }
    if not sim_only:
        out["measured"] = _measure(replicas, clients, duration_s, warmup_s, backends, load_procs)
    m1 = out["measured"].get("1", {}).get("cpu_us_per_request", {}).get("replicas")
    proxy_cpu = sim_proxy_cpu_us if sim_proxy_cpu_us is not None else (m1 or 350.0)
    leader_us = measure_leader_call_us(replicas=max(replicas), backends=4)
    _log(f"simulating with {proxy_cpu:.0f} us per request per replica, {leader_us:.0f} us per share call")
    ample = SimConfig(proxy_cpu_us=proxy_cpu, leader_call_us=leader_us)
    tight = SimConfig(proxy_cpu_us=proxy_cpu, leader_call_us=leader_us, backends=1, budget_mib=512)
    sim: dict[str, Any] = {
        "inputs": {
            "proxy_cpu_us": round(proxy_cpu, 1),
            "leader_call_us": round(leader_us, 1),
            "clients_per_replica": ample.clients,
            "service_s": ample.service_s,
            "request_mib": ample.request_mib,
            "ttl_s": ample.ttl_s,
            "duration_s": ample.duration_s,
            "ample_budget_mib": f"{ample.backends} x {ample.budget_mib}",
            "tight_budget_mib": f"{tight.backends} x {tight.budget_mib}",
        },
        "ample": {},
        "tight": {},
    }
    for n in replicas:
        for name, cfg in (("ample", ample), ("tight", tight)):
            r = sim_run(SimConfig(**{**_fields(cfg), "replicas": n}))
            r["leader_calls_per_request"] = (
                round(r["share_calls_per_s"] / r["requests_per_s"], 6) if r["requests_per_s"] else None
            )
            sim[name][str(n)] = r
    out["sim"] = sim
    return out


def _fields(cfg: Any) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def _measure(  # noqa: PLR0917 (one run's whole configuration)
    replicas: tuple[int, ...],
    clients: int,
    duration_s: float,
    warmup_s: float,
    nbackends: int,
    load_procs: int,
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-replicas-") as d:
        tmp = Path(d)
        log = (tmp / "log.txt").open("ab")
        procs: list[subprocess.Popen[bytes]] = []
        try:
            bports = [free_port() for _ in range(nbackends)]
            backends = []
            for p in bports:
                args = ["emulate-backend", "--model", MODEL, "--port", str(p), "--gpu", "H100-SXM5-80GB"]
                backends.append(_gpupool([*args, "--speed", "1000", "--kv-budget-mib", "65536"], log))
                procs.append(backends[-1])
            for p, proc in zip(bports, backends, strict=True):
                wait_http(f"http://127.0.0.1:{p}/v1/models", proc, what="backend")
            common = _files(tmp, bports)
            lport = free_port()
            serve = ["serve", "--port", str(lport), "--data-dir", str(tmp / "data")]
            serve += ["--cluster", str(tmp / "cluster.yaml"), *common]
            serve += ["--backends", str(tmp / "backends.yaml")]
            leader = _gpupool([*serve, "--no-simulate-readings"], log)
            procs.append(leader)
            wait_http(f"http://127.0.0.1:{lport}/healthz", leader, what="leader")
            # the baseline: the same load through the leader's own proxy (request leases in its lane)
            _log(f"leader only: {clients} clients, {warmup_s:g} s warm-up + {duration_s:g} s")
            cpu0 = (0.0, _cpu([leader.pid]), _cpu([x.pid for x in backends]))
            base = _phase([lport], clients, duration_s, warmup_s, load_procs)
            cpu1 = (0.0, _cpu([leader.pid]), _cpu([x.pid for x in backends]))
            res["leader"] = _summary(base, 0, 1.0, cpu0, cpu1)
            for n in replicas:
                ports = [free_port() for _ in range(n)]
                reps: list[subprocess.Popen[bytes]] = []
                for i, p in enumerate(ports):
                    args = ["proxy", "--leader", f"http://127.0.0.1:{lport}", "--port", str(p)]
                    args += ["--replica-id", f"r{i}", "--share-ttl-s", str(SHARE_TTL_S), *common]
                    reps.append(_gpupool(args, log))
                try:
                    for p, proc in zip(ports, reps, strict=True):
                        _wait_ok(f"http://127.0.0.1:{p}/healthz", proc)
                    _log(f"{n} replica(s): {clients} clients, {warmup_s:g} s warm-up + {duration_s:g} s")
                    c0 = _share_calls(lport)
                    cpu0 = (_cpu([x.pid for x in reps]), _cpu([leader.pid]), _cpu([x.pid for x in backends]))
                    t0 = time.monotonic()
                    load = _phase(ports, clients, duration_s, warmup_s, load_procs)
                    wall = time.monotonic() - t0
                    cpu1 = (_cpu([x.pid for x in reps]), _cpu([leader.pid]), _cpu([x.pid for x in backends]))
                    calls = _share_calls(lport) - c0
                finally:
                    stop(reps)
                s = _summary(load, calls, wall, cpu0, cpu1)
                _log(f"{n} replica(s): {s['requests_per_s']} req/s, p99 {s['p99_ms']} ms, bad {s['non_200']}")
                res[str(n)] = s
        finally:
            stop(procs)
            log.close()
    return res


def _summary(
    load: LoadResult, calls: int, wall_s: float, cpu0: tuple[float, ...], cpu1: tuple[float, ...]
) -> dict[str, Any]:
    s = load.summary()
    answers = max(1, load.answers_with_warmup)
    s["leader_share_calls_per_s"] = round(calls / wall_s, 2)
    s["leader_calls_per_request"] = round(calls / answers, 6)
    s["cpu_us_per_request"] = {
        k: round((b - a) / answers * 1e6, 1)
        for k, a, b in zip(("replicas", "leader", "backends"), cpu0, cpu1, strict=True)
    }
    return s


def _wait_ok(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until the replica's /healthz is 200 (it holds a valid share)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"proxy replica exited with status {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"proxy replica did not hold a share within {timeout_s:.0f} s ({url})")
