"""`gpupool run` (what `make run` does): the real product on the simulated example cluster.

Starts the gateway (`gpupool.cli.serve`) on the example cluster + agent-platform workloads, one emulated
OpenAI-compatible backend per planned model (in-process uvicorn servers on free loopback ports, timed
by the roofline model of the slice each runs on), and a small synthetic agent workload so that the
pool, the queues and backpressure are visibly alive:

- P0 chat: streamed ``/v1/chat/completions`` to the main LLM (tenant ``agent-chat``);
- P1 embeddings: ``/v1/embeddings`` to the embedding model (tenant ``retrieval``);
- P2 batch: ``POST /v1/leases`` of 8-24 GiB held 10-20 s then released; 429s back off (tenant ``batch``).

With ``--tidal-speed`` > 0 the tidal plane runs on a compressed clock (`gpupool.cli.tidalplane`): the
P0/P1 loops follow the trace's demand shape at the compressed time of day, real batch jobs (tenant
``tidal-batch``) are kept queued, and the first MIG GPU without an online backend is merged at NIGHT.

Starts from an empty lease store (the previous run's leases would otherwise be recovered and hold
the pool) unless ``--keep-state``. Prints the URL and the admin token, then a timestamped status line
every 5 s. Ctrl-C stops the node agents first (their last report still reaches the gateway), then
everything else at once: in-flight requests get ``serving.SHUTDOWN_GRACE_S``, then the servers and the
traffic stop together (about a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import secrets
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from gpupool.cli import fresh_start
from gpupool.cli.batch_first import batch_queue_first
from gpupool.cli.console import say
from gpupool.cli.data_dir import data_dir_option
from gpupool.cli.errors import UserError, check_listen, check_port, check_range, ensure_dir, user_errors
from gpupool.cli.serve import (
    DEFAULT_CLUSTER,
    DEFAULT_WORKLOADS,
    Bundle,
    KvSizer,
    build,
    plan_cluster,
    register_backends,
)
from gpupool.cli.serving import run_loop, uvicorn_server
from gpupool.cli.specfiles import spec_option

DEMO_TENANTS = ("agent-chat", "retrieval", "batch")


def start_emulated_backends(bundle: Bundle, *, host: str = "127.0.0.1", speed: float = 1.0) -> list[Any]:
    """One emulated backend per planned model (its first replica's slice); returns uvicorn servers."""
    from gpupool.adapters.backends.app import create_backend_app
    from gpupool.cli.emulate import build_engine

    sizer = KvSizer()
    slices = {st.slice.id: st.slice for st in bundle.controller.allocator.states()}
    specs: list[tuple[str, str, str, str]] = []
    servers = []
    seen: set[str] = set()
    held: list[socket.socket] = []  # each port stays bound until all are picked: no port twice
    for pl in bundle.plan.placements:
        w = bundle.workloads.by_name(pl.workload)
        if not w.model or w.model in seen or pl.slice not in slices:
            continue
        seen.add(w.model)
        s = slices[pl.slice]
        engine = build_engine(
            w.model,
            gpu=s.gpu_model,
            compute_fraction=max(0.01, min(1.0, s.capacity.compute_milli / 1000)),
            kv_budget_mib=sizer.kv_budget_mib(w.model, s.capacity.vram_mib, w.quant),
            quant=w.quant,
            speed=speed,
        )
        held.append(socket.create_server((host, 0)))
        port = int(held[-1].getsockname()[1])
        app = create_backend_app(
            engine,  # type: ignore[arg-type]
            model=w.model,
            task="embed" if w.arch is not None and not w.arch.is_decoder else "generate",
            max_model_len=w.max_context,
            scheduling_policy="priority",  # and the gateway is told so below: it sends `priority`
        )
        servers.append(uvicorn_server(app, host=host, port=port))
        specs.append((f"{w.name}-{pl.replica}", w.model, f"http://{host}:{port}", pl.slice))
    for sock in held:
        sock.close()
    register_backends(bundle, specs, {spec[0]: {"priority_scheduling": True} for spec in specs})
    return servers


def _models(bundle: Bundle) -> tuple[str | None, str | None]:
    """(largest P0 decoder model, first encoder model) among the registered backends."""
    chat: tuple[int, str] | None = None
    embed: str | None = None
    for b in bundle.backends:
        w = next((w for w in bundle.workloads if w.model == b.model), None)
        if w is None or w.arch is None:
            continue
        if w.arch.is_decoder and w.priority == "P0":
            if chat is None or w.arch.param_count > chat[0]:
                chat = (w.arch.param_count, b.model)
        elif not w.arch.is_decoder and embed is None:
            embed = b.model
    return (chat[1] if chat else None), embed


async def synthetic_workload(
    url: str,
    tokens: dict[str, str],
    bundle: Bundle,
    *,
    seed: int = 7,
    shape: Callable[[], float] | None = None,
) -> None:
    """``shape``: online demand relative to its mean now (the tidal demo's time of day); the P0 and
    P1 loops wait ``1 / shape`` times longer between requests (at most 30 s: a quiet night)."""
    import httpx

    rng = random.Random(seed)

    def pause(lo: float, hi: float) -> float:
        f = 1.0 if shape is None else max(0.01, shape())
        return min(30.0, rng.uniform(lo, hi) / f)

    chat_model, embed_model = _models(bundle)

    def hdr(tenant: str, prio: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens[tenant]}", "x-gpupool-priority": prio}

    async with httpx.AsyncClient(base_url=url, timeout=60) as cl:

        async def chat() -> None:
            while chat_model:
                body = {
                    "model": chat_model,
                    "stream": True,
                    "max_tokens": rng.randint(8, 48),
                    "messages": [
                        {"role": "user", "content": "plan the next tool call " * rng.randint(5, 60)}
                    ],
                }
                with contextlib.suppress(httpx.HTTPError):
                    async with cl.stream(
                        "POST", "/v1/chat/completions", json=body, headers=hdr("agent-chat", "P0")
                    ) as r:
                        async for _ in r.aiter_raw():
                            pass
                await asyncio.sleep(pause(0.2, 0.8))

        async def embed() -> None:
            while embed_model:
                body = {
                    "model": embed_model,
                    "input": ["chunk of a document " * rng.randint(5, 40) for _ in range(4)],
                }
                with contextlib.suppress(httpx.HTTPError):
                    await cl.post("/v1/embeddings", json=body, headers=hdr("retrieval", "P1"))
                await asyncio.sleep(pause(0.1, 0.4))

        async def batch(i: int) -> None:
            while True:
                body = {
                    "priority": "P2",
                    "vram_mib": rng.randint(8, 24) * 1024,
                    "compute_pct": 20,
                    "ttl_s": 60,
                }
                try:
                    r = await cl.post("/v1/leases", json=body, headers=hdr("batch", "P2"))
                except httpx.HTTPError:
                    await asyncio.sleep(2)
                    continue
                if r.status_code == 201:
                    await asyncio.sleep(rng.uniform(10, 20))
                    with contextlib.suppress(httpx.HTTPError):
                        await cl.delete(f"/v1/leases/{r.json()['id']}", headers=hdr("batch", "P2"))
                elif r.status_code == 202:
                    ticket = r.json()["ticket"]
                    with contextlib.suppress(httpx.HTTPError):
                        await cl.get(
                            f"/v1/tickets/{ticket}", params={"wait_s": 30}, headers=hdr("batch", "P2")
                        )
                else:
                    await asyncio.sleep(float(r.headers.get("retry-after", "2")))
                await asyncio.sleep(rng.uniform(0.5, 2))

        await asyncio.gather(chat(), embed(), *(batch(i) for i in range(6)))


async def status_printer(bundle: Bundle, period_s: float = 5.0) -> None:
    from gpupool.core.poolview import pool_view

    while True:
        await asyncio.sleep(period_s)
        v = pool_view(bundle.controller)
        cap, gr = v["capacity"], v["granted"]
        assert isinstance(cap, dict) and isinstance(gr, dict)
        pct = 100 * gr["vram_mib"] / max(1, cap["vram_mib"])
        tidal = v.get("tidal")
        mode = ""
        if isinstance(tidal, dict):
            mode = (
                f", tidal {tidal['mode']} at {str(tidal['local_time'])[11:16]} "
                f"(P2 {int(tidal['p2_held_mib']) // 1024}/{int(tidal['p2_share_mib']) // 1024} GiB, "
                f"demand {tidal['demand_per_min']}/min, jobs {tidal.get('batch_jobs', {})})"
            )
        say(
            f"pool: {gr['vram_mib'] // 1024}/{cap['vram_mib'] // 1024} GiB granted ({pct:.0f} %), "
            f"leases {v['active_leases']}, request leases {v['request_leases']}, queue {v['queue']}, "
            f"paused GPUs {v['paused_gpus'] or 'none'}{mode}"
        )


def standby_mig_gpus(bundle: Bundle) -> tuple[str, ...]:
    """The MIG GPUs no online backend uses (only standby replicas and P2 engines): merged at NIGHT."""
    prio = {w.model: w.priority_value for w in bundle.workloads or () if w.model}
    used = {b.gpu_id for b in bundle.backends if prio.get(b.model, 0) >= 0}
    mig = {st.slice.gpu_id for st in bundle.controller.allocator.states() if st.slice.kind.value == "mig"}
    return tuple(sorted(mig - used))[:1]


async def _agents_once_listening(
    listening: asyncio.Event, url: str, token: str, bundle: Any, runtimes: list[Any]
) -> None:
    """Start one node agent per simulated node once the gateway accepts connections (started
    before, their first report met a refused connection and said so at every start); they join
    ``runtimes``, which `stop_agents` stops. A failure to start them is said, not swallowed."""
    from gpupool.agent.engines import Engine
    from gpupool.agent.runtime import start_simulated_agents

    await listening.wait()
    engines = [Engine(gpu_id=b.gpu_id, endpoint=b.url, reserved_mib=b.kv_budget_mib) for b in bundle.backends]
    try:
        started = await asyncio.to_thread(
            start_simulated_agents, url, token=token, cluster=bundle.sim, engines=engines
        )
    except Exception as exc:  # (whatever the agents' start raises: the run goes on without them)
        say(f"node agents: not started: {exc}")
        return
    runtimes.extend(started)
    say(f"node agents: {len(started)} (one per simulated node, 200 ms period)")


def stop_agents(runtimes: list[Any]) -> None:
    """Stop the node agents in parallel (each joins its own loop thread)."""
    import threading

    threads = [threading.Thread(target=rt.stop, daemon=True) for rt in runtimes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)


@user_errors
def run(  # noqa: PLR0917 (typer options)
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8080, "--port", help="Gateway TCP port."),
    data_dir: Path = data_dir_option("SQLite store and admin token."),
    cluster: Path = spec_option(DEFAULT_CLUSTER, "--cluster", "Cluster"),
    workloads: Path = spec_option(DEFAULT_WORKLOADS, "--workloads", "Workload"),
    traffic: bool = typer.Option(True, help="Run the synthetic P0/P1/P2 agent workload."),
    tidal_speed: float = typer.Option(
        144.0, "--tidal-speed", help="Tidal compressed clock (x144: a day in 10 min); 0 turns it off."
    ),
    agents: bool = typer.Option(
        True,
        help="Start one node agent per simulated node (200 ms loop, readings over HTTP, vLLM KV "
        "correction from the emulated backends); --no-agents feeds raw readings in-process instead.",
    ),
    keep_state: bool = typer.Option(
        False,
        "--keep-state",
        help="Keep the leases of the previous run (default: start from an empty lease store).",
    ),
    kubernetes: bool = typer.Option(
        True, help="Serve kube-scheduler's extender verbs on the same ledger (no Kubernetes API: a dry run)."
    ),
    extender_port: int = typer.Option(0, "--extender-port", help="Extender verbs' port (0: any free one)."),
) -> None:
    """Gateway + emulated backends + synthetic agent traffic on the simulated example cluster."""
    from gpupool.cli.serving import serve_forever
    from gpupool.cli.stopping import catch_early_stop

    check_port("--port", port)
    catch_early_stop()
    check_range("--tidal-speed", tidal_speed, lo=0)
    ensure_dir("--data-dir", data_dir, create=False)
    check_port("--extender-port", extender_port)
    check_listen("--host/--port", host, port)
    kube = None
    if kubernetes:  # the control plane `serve --kubernetes` runs; the port is bound before the store opens
        from gpupool.cli import serve_k8s

        check_listen("--host/--extender-port", host, extender_port)  # (named as `run` names them)

        kube_opts = serve_k8s.KubeOptions(host=host, port=extender_port, no_kube=True)
        kube = serve_k8s.check(kube_opts)
    planned = plan_cluster(cluster, workloads)  # a bad spec file is exit 2 before the data dir is touched
    aside = None
    if not keep_state:  # only once every option is known good: bad input leaves the last run's state
        from gpupool.adapters.store.owner import StoreInUse

        try:  # (moved back if the start is refused: `gpupool.cli.fresh_start`)
            aside = fresh_start.set_aside(data_dir)
        except (OSError, StoreInUse) as exc:
            raise UserError(f"invalid --data-dir={str(data_dir)!r}: {exc}") from None
    runtimes: list[Any] = []
    bundle: Bundle | None = None
    started = False
    try:
        with contextlib.ExitStack() as start:  # batch.db first: a refused start leaves no trace of it
            queue = start.enter_context(batch_queue_first(data_dir)) if tidal_speed > 0 else None
            demo = {t: secrets.token_urlsafe(18) for t in DEMO_TENANTS}
            bundle = build(
                data_dir=data_dir,
                cluster=cluster,
                workloads=workloads,
                extra_tokens=[(tok, t, "tenant") for t, tok in demo.items()],
                planned=planned,
            )
            servers = start_emulated_backends(bundle, host=host)
            admin = bundle.new_admin_token or (data_dir / "admin.token").read_text().strip()
            url = f"http://{host}:{port}"
            say(f"gpupool gateway on {url}   (docs {url}/docs, metrics {url}/metrics)")
            say(f"admin token: {admin}   (stored in {data_dir / 'admin.token'})")
            say(f"try: curl -H 'Authorization: Bearer {admin}' {url}/v1/pool")
            say(f"console: {url}/?token={admin}")
            for b in bundle.backends:
                say(f"backend {b.id}: {b.model} at {b.url} on {b.slice_id} (KV budget {b.kv_budget_mib} MiB)")
            # the services' coroutines are made only once attach_tidal went through: a refused start
            # is then the one error line, with no "coroutine was never awaited" warnings
            extra: list[Any] = list(servers)
            shape = None
            if tidal_speed > 0:
                from gpupool.cli import tidalplane as tp

                cfg = tp.demo_config(tidal_speed, repartition_gpus=standby_mig_gpus(bundle))
                clock = tp.demo_clock(tidal_speed, cfg)
                rt = tp.attach_tidal(bundle, config=cfg, data_dir=data_dir, clock=clock, queue=queue)
                t = cfg.tidal
                say(
                    f"tidal: compressed clock x{tidal_speed:g} from {tp.DEMO_START_HOUR}:00 {t.timezone}; "
                    f"day {t.day_start}-{t.day_end}, night {t.night_start}-{t.night_end}; NIGHT re-partition "
                    f"of {', '.join(cfg.repartition_gpus) or 'no GPU'}; batch jobs: {url}/v1/batch/jobs"
                )
                extra.append(tp.tidal_loop(rt))
                if traffic:
                    extra.append(tp.demo_batch_jobs(rt))
                    shape = functools.partial(tp.demand_shape, rt)
        started = True
        if aside is not None and (removed := fresh_start.discard(data_dir, aside)):
            say(
                f"gpupool: fresh start: removed the previous run's lease store {removed[0]} "
                "(--keep-state keeps it)"
            )
        extra.append(status_printer(bundle))
        if kube is not None:
            extra.append(serve_k8s.run(bundle, kube, kube_opts))
        if traffic:
            extra.append(synthetic_workload(url, demo, bundle, shape=shape))
        listening = asyncio.Event()
        with_agents = agents and bundle.sim is not None
        if with_agents:
            extra.append(_agents_once_listening(listening, url, admin, bundle, runtimes))
        run_loop(
            serve_forever(
                bundle,
                host=host,
                port=port,
                extra=extra,
                feed_readings=not with_agents,
                listening=listening,
                before_stop=lambda: stop_agents(runtimes),  # their last report still meets the gateway
            )
        )
    except KeyboardInterrupt:
        pass  # NOTE: Ctrl-C during start-up; once serving, serve_forever handles the signal itself
    finally:
        stop_agents(runtimes)
        if bundle is not None:  # (SQLite folds its write-ahead log into leases.db and removes it)
            bundle.controller.store.close()
        if aside is not None and not started:  # refused: the previous run's files are back, as they were
            fresh_start.restore(data_dir, aside)
    say("gpupool: stopped")
