"""`gpupool serve`: the gateway (FastAPI on uvicorn) on a cluster + workload plan, with simulated devices
and a SQLite lease store. This module is a composition root: it wires the store, HTTP, metrics,
simulated-device and backend adapters around one core `LeaseController`.

Start-up: validate every argument (port, backends file, auth file, cluster and workloads files) and
plan the cluster for the workloads (`gpupool.hardware.planner`), build the inventory; only then open
the batch queue (``DATA_DIR/batch.db``, first: `gpupool.cli.batch_first`), read or generate the
admin token and open the store (``DATA_DIR/leases.db``, WAL + durable commits), recover leases
(expired ones are reclaimed; the ledger is rebuilt from the stored leases), register backends
(``--backends`` YAML or, for ``gpupool run``, emulated ones) each with a placement lease on its
planned slice, then serve.

Auth: ``--auth-file`` YAML ``tokens: [{token, tenant, role: tenant|admin}]``. Without it, an admin
token is generated on first start, stored in ``DATA_DIR/admin.token`` (mode 0600) and printed once.
Simulated readings: every 200 ms each simulated GPU's memory/temperature is fed to the watermark bank
(``--no-simulate-readings`` leaves that to node agents posting ``/v1/nodes/{node}/readings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.admin_token import create_admin_token, read_admin_token
from gpupool.cli.batch_first import batch_queue_first
from gpupool.cli.console import say
from gpupool.cli.data_dir import data_dir_option
from gpupool.cli.errors import (
    UserError,
    check_domain,
    check_listen,
    check_port,
    check_range,
    ensure_dir,
    user_errors,
)
from gpupool.cli.instances import InstanceKeeper, placement_request
from gpupool.cli.kvsizer import KvSizer
from gpupool.cli.ray_address import check_ray_address
from gpupool.cli.ray_address import connect as ray_connect

__all__ = ["KvSizer", "build", "load_tokens", "serve"]
from gpupool.cli.leaseclock import lease_clock
from gpupool.cli.serving import run_loop, serve_forever
from gpupool.cli.specfiles import spec_option
from gpupool.cli.stopping import catch_early_stop
from gpupool.cli.store_options import open_lease_store, store_settings
from gpupool.core.clock import Clock
from gpupool.core.controller import ControllerConfig, LeaseController
from gpupool.core.errors import InvalidInput
from gpupool.core.ports import Backend, GatewayEvent
from gpupool.core.sessions import DEFAULT_RED_LINE_PCT
from gpupool.core.watermarks import Reading
from gpupool.hardware.slices import Slice

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CLUSTER = REPO_ROOT / "examples" / "cluster-a100-l40s.yaml"
DEFAULT_WORKLOADS = REPO_ROOT / "examples" / "workloads-agent-platform.yaml"
ETCD_COMMIT_WINDOW = 2
"""Group commits in flight at once on an etcd store (`GroupCommitter.window`)."""


def load_tokens(auth_file: Path | None, data_dir: Path) -> tuple[list[tuple[str, str, str]], str | None]:
    """(entries, newly generated admin token or None)."""
    if auth_file is not None:
        from gpupool.cli.specfiles import load_yaml

        doc = load_yaml(auth_file)
        if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
            raise UserError(f"{auth_file}: expected 'tokens: [{{token, tenant, role}}]'")
        out = []
        for i, t in enumerate(doc["tokens"]):
            if not isinstance(t, dict):
                raise UserError(f"{auth_file}: tokens[{i}] must be a mapping")
            out.append((str(t.get("token", "")), str(t.get("tenant", "")), str(t.get("role", "tenant"))))
        return out, None
    ensure_dir("--data-dir", data_dir)
    path = data_dir / "admin.token"
    if path.exists():
        return [(read_admin_token(path, data_dir), "admin", "admin")], None
    token = create_admin_token(path, data_dir)
    return [(token, "admin", "admin")], token


@dataclass
class Bundle:
    controller: LeaseController
    app: Any
    tokens: list[tuple[str, str, str]]
    new_admin_token: str | None
    sim: Any = None
    plan: Any = None
    workloads: Any = None
    backends: list[Backend] = field(default_factory=list)
    tidal: Any = None
    """The `TidalRuntime` a replica attached after winning (`gpupool.cli.ha`); None otherwise."""
    keeper: InstanceKeeper | None = None
    """Keeps the registered backends' placement leases (`gpupool.cli.instances`)."""
    wall: Callable[[], float] = time.time
    """The wall clock: the lease clock's anchor and the tidal schedule's time of day."""


def plan_cluster(cluster: Path, workloads: Path) -> tuple[Any, Any, Any, list[Slice]]:
    from gpupool.cli.specfiles import load_specs
    from gpupool.hardware.planner import inventory_from_plan, plan

    cspec, wset = load_specs(cluster, workloads)
    p = plan(cspec, wset)
    return cspec, wset, p, list(inventory_from_plan(p))


def build(
    *,
    data_dir: Path,
    cluster: Path = DEFAULT_CLUSTER,
    workloads: Path = DEFAULT_WORKLOADS,
    auth_file: Path | None = None,
    store_url: str | None = None,
    store_options: dict[str, Any] | None = None,
    simulate: bool = True,
    extra_tokens: Iterable[tuple[str, str, str]] = (),
    metrics_tenant_labels: bool = False,
    app_options: dict[str, Any] | None = None,
    store: Any = None,
    planned: tuple[Any, Any, Any, list[Slice]] | None = None,
    clock: Clock | None = None,
    wall: Callable[[], float] = time.time,
) -> Bundle:
    """``store``: an open lease store to use (the HA mode passes the one its election fences);
    default: open ``store_url``. ``planned``: `plan_cluster` of ``cluster`` and ``workloads`` when
    the caller has it (`gpupool run` plans first to check them): the files are read once. ``clock``:
    the lease clock; default `lease_clock` (``wall`` anchored now, then monotonic). ``wall``: the
    wall clock (tests step their own), kept as ``Bundle.wall`` for the tidal schedule."""
    from gpupool.adapters.http.app import create_app
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.adapters.metrics.gateway import GatewayMetrics
    from gpupool.adapters.store import open_store

    cspec, wset, p, slices = planned or plan_cluster(cluster, workloads)
    tokens, new_admin = load_tokens(auth_file, data_dir)
    tokens = [*tokens, *extra_tokens]
    try:
        table = TokenTable(tokens)
    except InvalidInput as exc:
        raise UserError(f"{auth_file or data_dir / 'admin.token'}: {exc}") from None
    # every other argument is valid by now: only then open (and recover) the store
    import sqlite3

    url = store_url or f"sqlite:{data_dir / 'leases.db'}"
    if store is None:
        opener = functools.partial(open_store, url, **(store_options or {}))
        store = open_lease_store(url, opener, data_dir=data_dir, new_admin=new_admin)
    controller = LeaseController(
        slices,
        clock=clock or lease_clock(wall),
        store=store,
        config=ControllerConfig(kv_red_line_pct=DEFAULT_RED_LINE_PCT),
    )
    saved = store.get_meta("watermarks")
    if saved:
        import json

        from gpupool.core.watermarks import WatermarkConfig

        with contextlib.suppress(InvalidInput, TypeError, ValueError):
            controller.set_watermarks(WatermarkConfig(**json.loads(saved)))
    from gpupool.adapters.http.node_slices import recover_pool  # agents' slices first, then leases

    try:
        report = recover_pool(controller)
    except (OSError, sqlite3.Error) as exc:
        raise UserError(f"cannot recover the leases of {url}: {exc}") from None
    say(f"gpupool: recovered {report.restored} leases ({report.expired} expired, {report.revoked} revoked)")
    commits: list[Any] = []
    metrics = GatewayMetrics(
        controller,
        commits=lambda: (commits[0].batches, commits[0].writes),
        tenant_labels=metrics_tenant_labels,
    )
    sizer = KvSizer({w.model: w.quant for w in wset if w.model})
    app = create_app(
        controller, tokens=table, sizer=sizer, metrics=metrics, agent_events=True, **(app_options or {})
    )
    gw = app.state.gateway
    commits.append(gw.committer)
    from gpupool.adapters.http.context import DEVICE_STATES_META, parse_device_states, restore_drained

    gw.device_states = parse_device_states(store.get_meta(DEVICE_STATES_META))
    restore_drained(controller)  # an admin's drains outlive a restart
    if url.startswith(("etcd://", "etcds://")):
        # a commit is a network round trip: several in flight, awaited on the loop (runtime.py)
        gw.committer.window = ETCD_COMMIT_WINDOW
    gw.hub.extra.append(metrics.observe_event)
    sim = None
    if simulate:
        from gpupool.adapters.simulated import SimulatedCluster

        sim = SimulatedCluster(cspec, p, seed=0, clock=time.monotonic)
        mirror = _mirror_into(sim)  # (skips a slice the simulated cluster lacks: an agent's)
        gw.hub.extra.append(mirror)
        for lease in controller.leases():
            mirror(GatewayEvent(kind="granted", at=lease.granted_at, lease=lease))
    return Bundle(controller, app, tokens, new_admin, sim, p, wset, wall=wall)


def _mirror_into(sim: Any) -> Any:
    def on_event(e: GatewayEvent) -> None:
        if e.lease is None:
            return
        if e.kind == "granted":
            for g in e.lease.grants:
                with contextlib.suppress(KeyError):
                    sim.grant(
                        e.lease.id,
                        g.slice_id,
                        vram_mib=g.resources.vram_mib,
                        compute_milli=g.resources.compute_milli,
                    )
        elif e.lease.state.ended:
            sim.release(e.lease.id)

    return on_event


def register_backends(
    bundle: Bundle,
    backends: Iterable[tuple[str, str, str, str]],
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Backend]:
    """(id, model, url, slice_id) -> registered backends, each holding a placement lease on its slice.

    ``options[id]`` (the OpenAI proxy's view of a backend): ``priority_scheduling`` (bool, vLLM
    ``--scheduling-policy priority``: send it ``priority``), ``max_model_len`` (default: the workload's
    ``max_context``, else the catalogue's), ``task`` (generate | embed, default from the catalogue)."""
    from gpupool.adapters.http.surface import configure_backend, configure_model

    c = bundle.controller
    if bundle.keeper is None:
        bundle.keeper = InstanceKeeper(c)
        bundle.app.state.gateway.hub.extra.append(bundle.keeper.on_event)
    options = options or {}
    ctx = {w.model: w.max_context for w in bundle.workloads or () if w.model}
    sizer = KvSizer()
    by_id = {st.slice.id: st.slice for st in c.allocator.states()}
    out = []
    quant = {w.model: w.quant for w in bundle.workloads or () if w.model}
    prio = {w.model: w.priority_value for w in bundle.workloads or () if w.model}
    for bid, model, url, slice_id in backends:
        s = by_id.get(slice_id)
        if s is None:
            raise UserError(f"backend {bid}: unknown slice {slice_id!r}")
        b = Backend(
            id=bid,
            model=model,
            url=url,
            node=s.node,
            gpu_id=s.gpu_id,
            kv_budget_mib=sizer.kv_budget_mib(model, s.capacity.vram_mib, quant.get(model, "bf16")),
            slice_id=slice_id,
        )
        opt = options.get(bid, {})
        try:
            configure_model(
                bundle.app,
                model,
                task=opt.get("task"),
                max_model_len=opt.get("max_model_len", ctx.get(model)),
            )
        except InvalidInput as exc:
            raise UserError(f"backend {bid}: {exc}") from None
        ps = opt.get("priority_scheduling", False)
        if not isinstance(ps, bool):
            raise UserError(f"backend {bid}: priority_scheduling {ps!r}: expected true or false")
        c.register_backend(b)
        configure_backend(bundle.app, bid, priority_scheduling=ps)
        bundle.keeper.add(b, placement_request(b, s, prio.get(model, 50)))
        out.append(b)
    c.flush()
    bundle.backends.extend(out)
    return out


async def feed_simulated_readings(bundle: Bundle, period_s: float = 0.2) -> None:
    """Every ``period_s``, one reading per simulated GPU into the controller. The pass yields to the
    event loop after each node: a whole pass over 64 GPUs held the loop for 1.5 ms (idle machine)
    to 5-16 ms (under load, with leases to mirror), and every request that arrived meanwhile waited
    for it (measured with `gpupool bench gateway`: a share of the lease tail)."""
    c, sim = bundle.controller, bundle.sim
    gw = bundle.app.state.gateway
    while True:
        await asyncio.sleep(period_s)
        now = c.clock.now()
        for i, node in enumerate(sim.nodes()):
            if i:
                await asyncio.sleep(0)
            snap = sim.read(node)  # (`read_all` is this, all nodes at once)
            for g in snap.gpus:
                gpu_id = f"{snap.node}/{g.index}"
                r = Reading(
                    gpu_id,
                    g.memory_used_mib,
                    max(1, g.memory_total_mib),
                    at_s=now,
                    temperature_c=g.temperature_c,
                )
                with contextlib.suppress(InvalidInput):
                    c.feed_reading(r, health="ok" if g.healthy else "failed")
        gw.committer.kick()


BACKEND_OPTIONS = ("priority_scheduling", "max_model_len", "task")


def _load_backends_file(path: Path) -> tuple[list[tuple[str, str, str, str]], dict[str, dict[str, Any]]]:
    """(specs, options by backend id); options are `register_backends`' optional keys."""
    from gpupool.cli.specfiles import load_yaml

    doc = load_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("backends"), list):
        raise UserError(f"{path}: expected 'backends: [{{id, model, url, slice_id}}]'")
    out = []
    opts: dict[str, dict[str, Any]] = {}
    for i, b in enumerate(doc["backends"]):
        if not isinstance(b, dict) or not all(
            isinstance(b.get(k), str) for k in ("id", "model", "url", "slice_id")
        ):
            raise UserError(f"{path}: backends[{i}] needs string id, model, url and slice_id")
        extra = set(b) - {"id", "model", "url", "slice_id", *BACKEND_OPTIONS}
        if extra:
            raise UserError(f"{path}: backends[{i}]: unknown key {sorted(extra)[0]!r}")
        out.append((b["id"], b["model"], b["url"], b["slice_id"]))
        opts[b["id"]] = {k: b[k] for k in BACKEND_OPTIONS if k in b}
    return out, opts


def _load_objectives_file(path: Path) -> dict[str, int]:
    from gpupool.adapters.http.openai_request import objective_table
    from gpupool.cli.specfiles import load_yaml

    doc = load_yaml(path)
    if not isinstance(doc, dict) or "objectives" not in doc:
        raise UserError(f"{path}: expected 'objectives: [{{name, priority}}]'")
    try:
        return objective_table(doc["objectives"])
    except InvalidInput as exc:
        raise UserError(f"{path}: {exc}") from None


@user_errors
def serve(  # noqa: PLR0917 (typer options)
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8080, "--port", help="TCP port."),
    data_dir: Path = data_dir_option("SQLite store and generated token."),
    cluster: Path = spec_option(DEFAULT_CLUSTER, "--cluster", "Cluster"),
    workloads: Path = spec_option(DEFAULT_WORKLOADS, "--workloads", "Workload"),
    auth_file: Path | None = typer.Option(None, "--auth-file", help="tokens: [{token, tenant, role}] YAML."),
    backends: Path | None = typer.Option(
        None, "--backends", help="backends: [{id, model, url, slice_id}] YAML."
    ),
    simulate_readings: bool = typer.Option(True, help="Feed simulated GPU readings to the watermarks."),
    objectives: Path | None = typer.Option(
        None,
        "--objectives",
        help="objectives: [{name, priority}] YAML for x-gateway-inference-objective "
        "(default interactive=P0, retrieval=P1, batch=P2).",
    ),
    metrics_tenant_labels: bool = typer.Option(
        False,
        "--metrics-tenant-labels",
        help="Label /metrics lease gauges with tenant names (off: no names).",
    ),
    max_body_kib: int = typer.Option(
        1024, "--max-body-kib", help="Lease/admin/agent body limit (413 above)."
    ),
    max_proxy_body_kib: int = typer.Option(
        32 * 1024, "--max-proxy-body-kib", help="OpenAI-route body limit (413 above)."
    ),
    header_timeout_s: float = typer.Option(
        10.0, "--header-timeout-s", help="Close a connection whose request head is not complete in time."
    ),
    max_connections: int = typer.Option(
        1000, "--max-connections", help="Open connections + running requests; past it new requests get 503."
    ),
    store: str | None = typer.Option(
        None,
        "--store",
        help="Lease store: sqlite:///PATH (default DATA_DIR/leases.db) or etcd://HOST:PORT,HOST:PORT.../PREFIX/"
        " (etcds:// for TLS). See docs/store.md.",
    ),
    etcd_cacert: Path | None = typer.Option(
        None, "--etcd-cacert", help="CA bundle that signed etcd's certificate."
    ),
    etcd_cert: Path | None = typer.Option(
        None, "--etcd-cert", help="Client certificate for etcd (with --etcd-key)."
    ),
    etcd_key: Path | None = typer.Option(None, "--etcd-key", help="Client key for etcd (with --etcd-cert)."),
    etcd_user: str | None = typer.Option(None, "--etcd-user", help="etcd user (with --etcd-password)."),
    etcd_password: str | None = typer.Option(
        None,
        "--etcd-password",
        envvar="GPUPOOL_ETCD_PASSWORD",
        help="etcd password (or $GPUPOOL_ETCD_PASSWORD).",
    ),
    etcd_max_txn_ops: int = typer.Option(
        128, "--etcd-max-txn-ops", help="etcd's --max-txn-ops: the most writes one group commit may carry."
    ),
    election_ttl_s: int = typer.Option(
        2,
        "--election-ttl-s",
        help="etcd store: the leader's etcd lease TTL; a standby takes over this long after the leader "
        "stops renewing (docs/ops/ha.md).",
    ),
    advertise_url: str | None = typer.Option(
        None,
        "--advertise-url",
        envvar="GPUPOOL_ADVERTISE_URL",
        help="etcd store: the URL other replicas forward writes to while this one leads "
        "(default http://HOST:PORT; in Kubernetes http://$(POD_IP):PORT).",
    ),
    kubernetes: bool = typer.Option(
        False, "--kubernetes", help="Also serve kube-scheduler's extender verbs on this ledger."
    ),
    extender_host: str = typer.Option("127.0.0.1", "--extender-host", help="--kubernetes: extender address."),
    extender_port: int = typer.Option(8888, "--extender-port", help="--kubernetes: extender TCP port."),
    extender_prefix: str = typer.Option("", "--extender-prefix", help="--kubernetes: verbs' URL prefix."),
    domain: str = typer.Option("gpupool.io", "--domain", help="--kubernetes: extended resource domain."),
    kube_api: str = typer.Option("", "--kube-api", help="--kubernetes: API URL (default: in-cluster)."),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="--kubernetes: kubeconfig file."),
    no_kube: bool = typer.Option(False, "--no-kube", help="--kubernetes without an API: bind only commits."),
    tidal: bool = typer.Option(
        True,
        help="Run tidal time-sharing: DAY/NIGHT on measured P0+P1 demand, the DAY reservation for P0/P1, "
        "the batch queue (/v1/batch/jobs). See docs/tidal/README.md.",
    ),
    tidal_config: Path | None = typer.Option(
        None, "--tidal-config", help="YAML 'tidal: {setting: value}' (schedule, time zone, shares, GPUs)."
    ),
    timezone: str | None = typer.Option(
        None, "--timezone", help="IANA time zone of the tidal schedule (default Asia/Shanghai)."
    ),
    ray_address: str | None = typer.Option(
        None, "--ray-address", help="Batch jobs on this Ray cluster: HOST:PORT, ray://HOST:PORT or auto."
    ),
) -> None:
    """Serve the lease API, events, metrics and the OpenAI-compatible proxy."""
    for flag, v in (
        ("--max-body-kib", max_body_kib),
        ("--max-proxy-body-kib", max_proxy_body_kib),
        ("--max-connections", max_connections),
    ):
        if v < 1:
            raise UserError(f"{flag} {v}: must be >= 1")
    if not (math.isfinite(header_timeout_s) and header_timeout_s > 0):
        raise UserError(f"--header-timeout-s {header_timeout_s}: must be a positive number of seconds")
    check_port("--port", port)
    ensure_dir("--data-dir", data_dir, create=False)  # created once every option is known good
    catch_early_stop()
    store_options = store_settings(
        store,
        cacert=etcd_cacert,
        cert=etcd_cert,
        key=etcd_key,
        user=etcd_user,
        password=etcd_password,
        max_txn_ops=etcd_max_txn_ops,
        etcd_only={"--election-ttl-s": election_ttl_s != 2, "--advertise-url": advertise_url},
    )
    check_port("--extender-port", extender_port)  # (checked with or without --kubernetes)
    check_domain("--domain", domain)
    check_listen("--host/--port", host, port)
    check_ray_address(ray_address)
    kube = None
    if kubernetes:
        from gpupool.cli import serve_k8s

        kube_opts = serve_k8s.KubeOptions(
            extender_host, extender_port, extender_prefix, domain, kube_api, kubeconfig, no_kube
        )
        kube = serve_k8s.check(kube_opts)
    plane_cfg = None
    if tidal:
        from gpupool.cli.tidalplane import load_plane_config

        plane_cfg = load_plane_config(tidal_config, timezone=timezone)
    table = _load_objectives_file(objectives) if objectives is not None else None
    backend_specs = _load_backends_file(backends) if backends is not None else None
    # the last check, since it connects: `auto` finding no cluster is refused before the data dir exists
    ray = ray_connect(ray_address) if ray_address and plane_cfg is not None else None

    def make_bundle(open_store: Any = None) -> Bundle:
        bundle = build(
            data_dir=data_dir,
            cluster=cluster,
            workloads=workloads,
            auth_file=auth_file,
            store_url=store,
            store_options=store_options,
            simulate=simulate_readings,
            metrics_tenant_labels=metrics_tenant_labels,
            app_options={
                "max_body_bytes": max_body_kib * 1024,
                "max_proxy_body_bytes": max_proxy_body_kib * 1024,
            },
            store=open_store,
        )
        if table is not None:
            from gpupool.adapters.http.surface import set_objectives

            set_objectives(bundle.app, table)
        if backend_specs is not None:
            register_backends(bundle, *backend_specs)
        return bundle

    opts: dict[str, Any] = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}
    if store is not None and store.startswith(("etcd://", "etcds://")):
        from gpupool.cli.ha import advertise_url_of, default_extender_url, serve_replicated

        check_range("--election-ttl-s", election_ttl_s, lo=2, hi=60)
        advertise = advertise_url_of(advertise_url, host, port)

        def make_leader(open_store: Any) -> Bundle:
            """The leader's bundle, rebuilt from the store after winning; the batch queue is the
            store's own (`EtcdJobQueue`), its running and paused jobs requeued now."""
            bundle = make_bundle(open_store)
            if plane_cfg is not None:
                from gpupool.adapters.store.etcd_jobs import EtcdJobQueue
                from gpupool.cli.tidalplane import attach_serving

                bundle.tidal = attach_serving(
                    bundle, config=plane_cfg, data_dir=data_dir, ray=ray, queue=EtcdJobQueue(open_store)
                )
            return bundle

        def leader_services(bundle: Bundle, gate: Any) -> list[Any]:
            out: list[Any] = []
            if bundle.tidal is not None:
                from gpupool.cli.tidalplane import tidal_loop

                out.append(tidal_loop(bundle.tidal, leading=gate))
            if kube is not None:
                out.append(serve_k8s.run(bundle, kube, kube_opts, gate=gate))
            return out

        code = serve_replicated(
            make_bundle=make_leader,
            store_url=store,
            store_options=store_options,
            data_dir=data_dir,
            auth_file=auth_file,
            cluster=cluster,
            workloads=workloads,
            host=host,
            port=port,
            advertise_url=advertise,
            ttl_s=election_ttl_s,
            server_options=opts,
            leader_services=leader_services,
            extender=None if kube is None else kube.server,
            extender_url=default_extender_url(advertise, extender_port, extender_prefix),
        )
        raise typer.Exit(code)
    extra: list[Any] = []
    with contextlib.ExitStack() as start:  # batch.db first: a refused start leaves the data dir as it was
        queue = start.enter_context(batch_queue_first(data_dir)) if plane_cfg is not None else None
        bundle = make_bundle()
        say(f"gpupool gateway on http://{host}:{port}  (store {store or data_dir / 'leases.db'})")
        if bundle.new_admin_token:
            say(f"admin token (stored in {data_dir / 'admin.token'}, shown once): {bundle.new_admin_token}")
        if plane_cfg is not None:
            from gpupool.cli.tidalplane import attach_serving, tidal_loop

            rt = attach_serving(bundle, config=plane_cfg, data_dir=data_dir, ray=ray, queue=queue)
            extra.append(tidal_loop(rt))
            say(f"tidal: {rt.plane.mode.value} now; next: {rt.plane.next_switch()['earliest_local']}")
    with contextlib.suppress(KeyboardInterrupt):
        if kube is not None:
            extra.append(serve_k8s.run(bundle, kube, kube_opts))
        try:
            run_loop(serve_forever(bundle, host=host, port=port, extra=extra, server_options=opts))
        finally:  # (SQLite folds its write-ahead log into leases.db and removes it)
            bundle.controller.store.close()
