"""`gpupool bench ...`: benchmark drivers. Each prints one JSON object with ``--json``; numbers are
recorded in BENCHMARKS.md together with the command that produced them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.errors import UserError, check_range, user_errors

app = typer.Typer(help="Benchmarks; each prints one JSON object with --json.", no_args_is_help=True)


def _echo_rows(rows: dict[str, dict[str, Any]], width: int, line: Callable[[dict[str, Any]], str]) -> None:
    """One line per compared target: its name, then ``line(row)``, or why it was unavailable."""
    for name, row in rows.items():
        typer.echo(f"{name:<{width}} " + (line(row) if row["available"] else f"unavailable: {row['reason']}"))


@app.command("allocator")
@user_errors
def allocator(
    *,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    sizes: str = typer.Option("1000,10000,100000", help="Comma-separated slice counts."),
    ops: int = typer.Option(20000, help="allocate+release pairs timed per size for gpupool."),
    seed_ops: int = typer.Option(2000, help="Pairs timed for the seed reference (sampled at large sizes)."),
    seed: int = typer.Option(1, help="Random seed of the request stream."),
    policy: str = typer.Option("bestfit", help="Core placement policy (gpupool's side only)."),
) -> None:
    """Steady-state allocate+release cost: gpupool's indexed allocator vs the seed's reference."""
    from gpupool.bench import allocator_bench
    from gpupool.core.errors import InvalidInput
    from gpupool.core.policies import POLICIES

    if policy not in POLICIES:
        raise InvalidInput("--policy", policy, f"known policies: {', '.join(sorted(POLICIES))}")

    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput("--sizes", sizes, "expected comma-separated integers") from None
    if not size_list or any(n < 10 for n in size_list):
        raise InvalidInput("--sizes", sizes, "each size must be an integer >= 10")
    for name, value in (("--ops", ops), ("--seed-ops", seed_ops)):
        if value < 1:
            raise InvalidInput(name, value, "must be >= 1")
    result = allocator_bench.run(sizes=size_list, ops=ops, seed_ops=seed_ops, seed=seed, policy=policy)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for row in result["results"]:
            typer.echo(
                f"{row['slices']:>7} slices: gpupool {row['gpupool_us_per_op']:.2f} us/op, "
                f"seed {row['seed_us_per_op']:.1f} us/op, speed-up {row['speedup']:.0f}x"
            )


from gpupool.cli.plan import bench_plan  # noqa: E402  (reason: registration kept next to its line)

app.command("plan", help="Planning time of the example specs (gpupool plan).")(bench_plan)

from gpupool.cli.agent import bench_agent  # noqa: E402  (reason: registration kept next to its line)

app.command("agent", help="Node agent: tick cost per GPU and pause reaction time.")(bench_agent)

from gpupool.cli.extender import bench_extender  # noqa: E402  (reason: registration kept next to its line)

app.command("extender", help="Kubernetes extender: filter+prioritize latency over 1,000 nodes x 8 GPUs.")(
    bench_extender
)


@app.command("tokens")
@user_errors
def tokens(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    prompts: int = typer.Option(400, "--prompts", help="Varied prompts (half train the correction)."),
    seed: int = typer.Option(1, "--seed", help="Random seed of the prompt set."),
) -> None:
    """The proxy's prompt-token estimate against the backend's /tokenize, before and after correction."""
    from gpupool.bench import tokens_bench
    from gpupool.core.errors import InvalidInput

    if prompts < 10:
        raise InvalidInput("--prompts", prompts, "must be >= 10")
    result = tokens_bench.run(n=prompts, seed=seed)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for k, v in result.items():
            typer.echo(f"{k}: {v}")


@app.command("gateway")
@user_errors
def gateway(  # noqa: PLR0917 (typer options)
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    clients: int = typer.Option(32, help="Concurrent keep-alive HTTP clients."),
    duration_s: float = typer.Option(20.0, help="Seconds per phase (no-op, then lease)."),
    proxy_clients: int = typer.Option(4, help="Clients of the second proxy phase (the first uses 1)."),
    proxy_duration_s: float = typer.Option(5.0, help="Seconds per proxy phase (direct, then via gateway)."),
    warmup_s: float = typer.Option(1.0, help="Warm-up seconds before each lease/no-op phase."),
    store: str = typer.Option("sqlite", "--store", help="sqlite, or etcd (the run starts its own etcd)."),
    slices: int = typer.Option(
        1,
        "--slices",
        help="Cut the no-op and lease phases into this many parts each, run alternately, so that a "
        "change of the machine's speed during the run weighs on both alike (1: no-op, then lease).",
    ),
) -> None:
    """Lease acquire+release round trips over HTTP against a `gpupool serve` process (SQLite or etcd,
    durable group commit) vs a no-op endpoint of the same app, and the OpenAI proxy's added latency
    against calling the backend directly. Non-2xx answers are counted, never dropped."""
    from gpupool.bench import gateway_bench

    for name, value in (("--clients", clients), ("--proxy-clients", proxy_clients)):
        check_range(name, value, lo=1)
    for name, secs in (("--duration-s", duration_s), ("--proxy-duration-s", proxy_duration_s)):
        check_range(name, secs, lo=0, lo_open=True)
    check_range("--warmup-s", warmup_s, lo=0)
    check_range("--slices", slices, lo=1, hi=100)
    if store not in ("sqlite", "etcd"):
        raise UserError(f"invalid --store={store!r}: expected sqlite or etcd")
    result = gateway_bench.run(
        store=store,
        slices=slices,
        clients=clients,
        duration_s=duration_s,
        proxy_clients=proxy_clients,
        proxy_duration_s=proxy_duration_s,
        warmup_s=warmup_s,
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for k, v in result.items():
            typer.echo(f"{k}: {v}")


@app.command("proxy-peers")
@user_errors
def proxy_peers(  # noqa: PLR0917 (typer options)
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    clients: int = typer.Option(8, help="Clients of the throughput phase (the latency phase uses 1)."),
    duration_s: float = typer.Option(5.0, help="Seconds per phase and target."),
    warmup_s: float = typer.Option(1.0, help="Warm-up seconds before each phase."),
    rounds: int = typer.Option(1, help="Rounds over all targets; figures are medians over rounds."),
    targets: str = typer.Option(
        "direct,gpupool,vllm-router,litellm", help="Comma-separated subset of the four targets."
    ),
    peers_venv: Path = typer.Option(
        Path(".gpupool/peers-venv"), help="Venv for the peers (installed there on demand)."
    ),
    install_peers: bool = typer.Option(True, help="pip-install missing peers into --peers-venv."),
) -> None:
    """/v1/completions (max_tokens 1) through gpupool vs vLLM's Rust router vs LiteLLM proxy vs the
    emulated backend directly: p50/p99 at 1 client, added p50, requests/s at --clients clients."""
    from gpupool.bench import proxy_peers_bench
    from gpupool.core.errors import InvalidInput

    names = tuple(t.strip() for t in targets.split(",") if t.strip())
    bad = [t for t in names if t not in proxy_peers_bench.TARGETS]
    if not names or bad:
        raise InvalidInput(
            "--targets", targets, f"expected a subset of {','.join(proxy_peers_bench.TARGETS)}"
        )
    for name, value in (("--clients", clients), ("--rounds", rounds)):
        if value < 1:
            raise InvalidInput(name, value, "must be >= 1")
    check_range("--duration-s", duration_s, lo=0, lo_open=True)  # (inf: a run that never ends)
    check_range("--warmup-s", warmup_s, lo=0)
    result = proxy_peers_bench.run(
        clients=clients,
        duration_s=duration_s,
        warmup_s=warmup_s,
        rounds=rounds,
        targets=names,
        peers_venv=peers_venv,
        install_peers=install_peers,
    )
    if as_json:
        typer.echo(json.dumps(result))
        return
    _echo_rows(
        result["targets"],
        12,
        lambda t: (
            f"p50 {t['p50_ms']} ms  p99 {t['p99_ms']} ms  added p50 {t['added_p50_ms']} ms  "
            f"{t['requests_per_s']} req/s at {clients} clients  non-200 {t['non_200']}"
        ),
    )


@app.command("preempt")
@user_errors
def preempt(  # noqa: PLR0917 (typer options)
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    runs: int = typer.Option(20, help="P0 arrivals timed per path."),
    holders: int = typer.Option(2, help="Real child processes filling the simulated GPU."),
    grace_ms: int = typer.Option(500, help="SIGTERM -> SIGKILL grace of the agent."),
    period_ms: int = typer.Option(200, help="Agent control-loop period."),
    paths: str = typer.Option("signal-kill,sigterm,sleep", help="Comma-separated freeing paths."),
) -> None:
    """P0 arrival on a full simulated GPU held by real child processes -> their VRAM confirmed free
    and the P0 grant usable, per freeing path (p50/p99 ms)."""
    from gpupool.bench import preempt_bench
    from gpupool.core.errors import InvalidInput

    names = tuple(p.strip() for p in paths.split(",") if p.strip())
    bad = [p for p in names if p not in preempt_bench.PATHS]
    if not names or bad:
        raise InvalidInput("--paths", paths, f"expected a subset of {','.join(preempt_bench.PATHS)}")
    check_range("--runs", runs, lo=1)
    check_range("--holders", holders, lo=1, hi=16)
    check_range("--grace-ms", grace_ms, lo=0, hi=30_000)
    check_range("--period-ms", period_ms, lo=10, hi=10_000)
    result = preempt_bench.run(
        runs=runs, holders=holders, grace_ms=grace_ms, period_ms=period_ms, paths=names
    )
    if as_json:
        typer.echo(json.dumps(result))
        return
    for name, t in result["paths"].items():
        typer.echo(f"{name:<12} p50 {t['p50_ms']} ms  p99 {t['p99_ms']} ms  ({result['runs']} runs)")


@app.command("failover")
@user_errors
def failover(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    kills: int = typer.Option(10, help="Times the leader is killed with SIGKILL."),
    replicas: int = typer.Option(3, help="gpupool serve replicas on the one etcd."),
    ttl_s: int = typer.Option(2, "--ttl-s", help="The replicas' --election-ttl-s."),
    clients: int = typer.Option(4, help="Client threads under load during the kills."),
) -> None:
    """Replicas of gpupool serve on a real etcd under load; SIGKILL the leader ``kills`` times:
    take-over seconds (p50/p99/max, TTL included), acknowledged leases lost, over-committed slices."""
    from gpupool.bench import failover_bench

    check_range("--kills", kills, lo=1, hi=1000)
    check_range("--replicas", replicas, lo=2, hi=9)
    check_range("--ttl-s", ttl_s, lo=2, hi=60)
    check_range("--clients", clients, lo=1, hi=64)
    result = failover_bench.run(kills=kills, replicas=replicas, ttl_s=ttl_s, clients=clients)
    if as_json:
        typer.echo(json.dumps(result))
        return
    t = result["takeover_s"]
    typer.echo(
        f"take-over p50 {t['p50']} s  p99 {t['p99']} s  max {t['max']} s over {result['runs']} kills; "
        f"lost leases {result['lost_leases']}, over-committed slices {result['overcommits']}"
    )


@app.command("kv")
@user_errors
def kv(  # noqa: PLR0917 (typer options)
    trace: Path = typer.Option(
        ..., "--trace", help="Mooncake-format JSONL trace (timestamp, lengths, hash_ids)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    limit: int = typer.Option(0, "--limit", help="Replay only the first N requests (0 = all)."),
    instances: int = typer.Option(4, "--instances", help="Emulated model instances."),
    time_scale: float = typer.Option(
        10.0, "--time-scale", help="Replay (and engines) this many times faster."
    ),
    arrival: str = typer.Option(
        "as-is", "--arrival", help="as-is, burst:S (each S-second window at once) or stretch:F (F x slower)."
    ),
    host_tier_mib: int = typer.Option(
        65536,
        "--host-tier-mib",
        help="Host-tier KV per instance (MiB); default: half of a 1 TiB node over 8 instances.",
    ),
    stream_interval: int = typer.Option(
        16, "--stream-interval", help="Tokens per streamed chunk of the emulated engines (CPU of the replay)."
    ),
    routers: str = typer.Option(
        "round-robin,vllm-router-cache-aware,gpupool", help="Comma-separated subset of the routers."
    ),
    peers_venv: Path = typer.Option(
        Path(".gpupool/peers-venv"), help="Venv for vllm-router (installed there on demand)."
    ),
    install_peers: bool = typer.Option(True, help="pip-install a missing vllm-router into --peers-venv."),
) -> None:
    """Replay a Mooncake trace through round robin, vllm-router cache_aware and gpupool against emulated
    instances with a prefix cache and host tier: prefix-hit rate, recomputed tokens, TTFT, preemptions."""
    from gpupool.bench import kv_bench
    from gpupool.core.errors import InvalidInput

    if not trace.is_file():
        raise InvalidInput("--trace", str(trace), "no such file")
    names = tuple(r.strip() for r in routers.split(",") if r.strip())
    if not names or any(r not in kv_bench.ROUTERS for r in names):
        raise InvalidInput("--routers", routers, f"expected a subset of {','.join(kv_bench.ROUTERS)}")
    for name, value in (("--limit", limit), ("--host-tier-mib", host_tier_mib)):
        if value < 0:
            raise InvalidInput(name, value, "must be >= 0")
    if instances < 1:
        raise InvalidInput("--instances", instances, "must be >= 1")
    if stream_interval < 1:
        raise InvalidInput("--stream-interval", stream_interval, "must be >= 1")
    if not 0 < time_scale < float("inf"):
        raise InvalidInput("--time-scale", time_scale, "must be > 0 and finite")
    try:
        kv_bench.parse_arrival(arrival)
    except ValueError:
        raise InvalidInput("--arrival", arrival, kv_bench.ARRIVAL_FORMS) from None
    try:
        result = kv_bench.run(
            trace_path=trace,
            limit=limit or None,
            instances=instances,
            time_scale=time_scale,
            arrival=arrival,
            host_tier_mib=host_tier_mib,
            stream_interval=stream_interval,
            routers=names,
            peers_venv=peers_venv,
            install_peers=install_peers,
        )
    except ValueError as exc:
        raise InvalidInput("--trace", str(trace), str(exc)) from None
    if as_json:
        typer.echo(json.dumps(result))
        return
    _echo_rows(
        result["routers"],
        24,
        lambda r: (
            f"hit {r['prefix_hit_rate']:.3f}  recomputed {r['recomputed_prompt_tokens']}  "
            f"TTFT p50 {r['ttft_p50_ms']} ms p99 {r['ttft_p99_ms']} ms  "
            f"preemptions {r['engine_preemptions']}  served {r['served']} shed {r['shed']}"
        ),
    )


@app.command("replicas")
@user_errors
def replicas(  # noqa: PLR0917 (typer options)
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    counts: str = typer.Option("1,2,4", "--replicas", help="Comma-separated replica counts to measure."),
    clients: int = typer.Option(16, help="Clients in all, spread evenly over the replicas."),
    duration_s: float = typer.Option(5.0, help="Seconds per replica count (after the warm-up)."),
    warmup_s: float = typer.Option(1.0, help="Warm-up seconds per replica count."),
    sim_proxy_cpu_us: float | None = typer.Option(
        None, help="Replica CPU per request for the simulation (default: measured at 1 replica)."
    ),
    sim_only: bool = typer.Option(False, "--sim-only", help="Skip the real processes; simulate only."),
    backends: int = typer.Option(2, help="Emulated backends (instances of the model) behind the leader."),
    load_procs: int = typer.Option(1, help="Load-generator processes the clients are spread over."),
) -> None:
    """The OpenAI proxy across 1, 2, 4 proxy replicas (`gpupool proxy`, request leases granted inside
    delegated KV shares): real processes on this machine, then the same core code in the simulator."""
    from gpupool.bench import replicas_bench

    try:
        ns = tuple(int(x) for x in counts.split(",") if x.strip())
    except ValueError:
        ns = ()
    if not ns or any(n < 1 or n > 64 for n in ns):
        raise UserError(f"invalid --replicas={counts!r}: expected comma-separated counts in [1, 64]")
    check_range("--clients", clients, lo=1)
    check_range("--duration-s", duration_s, lo=0, lo_open=True)
    check_range("--warmup-s", warmup_s, lo=0)
    check_range("--backends", backends, lo=1, hi=16)
    check_range("--load-procs", load_procs, lo=1, hi=64)
    if sim_proxy_cpu_us is not None:
        check_range("--sim-proxy-cpu-us", sim_proxy_cpu_us, lo=0, lo_open=True)
    result = replicas_bench.run(
        replicas=ns,
        clients=clients,
        duration_s=duration_s,
        warmup_s=warmup_s,
        sim_proxy_cpu_us=sim_proxy_cpu_us,
        sim_only=sim_only,
        backends=backends,
        load_procs=load_procs,
    )
    if as_json:
        typer.echo(json.dumps(result))
        return
    for n, r in result["measured"].items():
        rate = f"{r['requests_per_s']} req/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms"
        typer.echo(f"measured {n if n == 'leader' else n + ' replica(s)'}: {rate}")
    for kind in ("ample", "tight"):
        for n, r in result["sim"][kind].items():
            rate = f"{r['requests_per_s']} req/s  leader calls/s {r['share_calls_per_s']}"
            typer.echo(f"sim {kind} {n} replica(s): {rate}")
