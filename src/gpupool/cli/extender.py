"""`gpupool extender`: serve kube-scheduler's extender protocol over a static or live GPU pool.

Inventory, first match wins:
- ``--cluster FILE --workloads FILE``: the planner's layout (MIG / MPS / whole slices);
- ``--cluster FILE``: every card is one whole-GPU slice;
- neither: the ``<domain>/slices`` annotations that node agents write on the cluster's nodes.

Kubernetes API: in-cluster service account, else ``--kubeconfig`` / ``$KUBECONFIG``, or an explicit
``--kube-api URL``; when none is found the command exits 2 saying so (`NO_KUBE_API`), and an API
that cannot be listed at start-up is one line too. ``--no-kube`` runs without one (bind then only
commits the lease: a dry run for trying the protocol locally). The server listens on 127.0.0.1
unless ``--host`` says otherwise (kube-scheduler runs beside it, in the same pod). With an API the
pod reconciler and the preemptor (evicts P2 pods for pending higher-priority pods that fit nowhere)
run in background threads.

One ledger: this command is the same code path as ``gpupool serve --kubernetes`` (`start_services`
and the `ExtenderPool` translation over a core `LeaseController`), started with its own in-process
controller over ``--store`` (``memory:`` by default; ``sqlite:PATH`` or ``etcd://...`` keep pod
leases across restarts, recovered from the store; annotations are read back only to reconcile what
the store lacks). Run it standalone only when no gateway shares the cards: where both run, start
``gpupool serve --kubernetes`` instead, so pods and lease-API leases are granted from one ledger.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpupool.cli.errors import (
    UserError,
    check_domain,
    check_listen,
    check_log_level,
    check_port,
    check_range,
    check_url,
    options_named,
    user_errors,
)

if TYPE_CHECKING:
    from gpupool.adapters.k8s.extender import Extender
    from gpupool.adapters.k8s.kubeapi import KubeApi
    from gpupool.core.controller import LeaseController
    from gpupool.hardware.slices import Slice


def build_slices(
    cluster: Path | None, workloads: Path | None, *, api: object | None, domain: str
) -> tuple[list[object], str]:
    """The slices and a one-word description of where they came from."""
    from gpupool.adapters.k8s.inventory import slices_from_nodes
    from gpupool.adapters.k8s.kubeapi import KubeApi
    from gpupool.adapters.k8s.resources import ResourceNames
    from gpupool.cli.specfiles import load_cluster_file, load_workload_file
    from gpupool.hardware.planner import inventory_from_cluster, inventory_from_plan, plan

    if workloads is not None and cluster is None:
        raise UserError("--workloads needs --cluster")
    if cluster is not None:
        spec = load_cluster_file(cluster)
        if workloads is not None:
            return list(inventory_from_plan(plan(spec, load_workload_file(workloads)))), "plan"
        return list(inventory_from_cluster(spec)), "cluster-file"
    if not isinstance(api, KubeApi):
        raise UserError("no inventory: pass --cluster FILE, or run with a Kubernetes API (drop --no-kube)")
    slices, skipped = slices_from_nodes(api.list_nodes(), ResourceNames(domain))
    for node, why in sorted(skipped.items()):
        logging.getLogger("gpupool.extender").warning("node %s skipped: %s", node, why)
    return list(slices), "node-annotations"


def open_controller(slices: list[Slice], *, store_url: str, policy: str) -> LeaseController:
    """An in-process controller over ``store_url`` with its leases recovered (standalone extender)."""
    from gpupool.adapters.store import open_store
    from gpupool.cli.leaseclock import lease_clock
    from gpupool.core.controller import LeaseController
    from gpupool.core.errors import GpupoolError

    try:
        store = open_store(store_url)
    except (OSError, GpupoolError) as exc:
        raise UserError(f"cannot open the lease store --store={store_url!r}: {exc}") from None
    controller = LeaseController(slices, clock=lease_clock(), store=store, policy=policy)
    r = controller.recover()
    if r.restored + r.expired + r.revoked:
        logging.getLogger("gpupool.extender").info(
            "recovered %d leases from %s (%d expired, %d revoked)",
            *(r.restored, store_url, r.expired, r.revoked),
        )
    return controller


def start_services(
    ext: Extender,
    api: KubeApi | None,
    *,
    source: str,
    reconcile: bool,
    preempt_interval_s: float,
    inventory_resync_s: float,
    stop: threading.Event,
    listed: tuple[list[Any], float] | None = None,
) -> None:
    """The extender's background loops: inventory resync (node annotations), the pod reconciler (a
    first resync adopts what the store lacks before serving) and the preemptor. ``listed``: the pods
    and the clock reading before the list, when the caller listed them already (`list_pods_or_exit`)."""
    from gpupool.adapters.k8s.preemptor import Preemptor
    from gpupool.adapters.k8s.reconciler import PodReconciler

    pool, names = ext.pool, ext.names
    if api is not None and source == "node-annotations" and inventory_resync_s > 0:
        threading.Thread(
            target=_sync_inventory, args=(pool, api, names, inventory_resync_s, stop), daemon=True
        ).start()
    if api is None or not reconcile:
        return
    rec = PodReconciler(pool, names=names)
    ext.status["drift"] = lambda: [f"{d.pod}: {d.kind}: {d.detail}" for d in list(rec.drifts)[-20:]]
    # NOTE: adopt bound pods before serving
    if listed is not None:
        rec.resync(listed[0], listed_at=listed[1])
    else:
        before = rec.held()
        rec.resync(list_pods_or_exit(api), held_before=before)
    threading.Thread(target=rec.run, args=(api, stop), name="gpupool-reconciler", daemon=True).start()
    if preempt_interval_s > 0:
        pre = Preemptor(pool, names=names)
        ext.status["evictions"] = lambda: [
            f"{e.for_pod} on {e.node}: {[f'{ns}/{n}' for _, ns, n in e.victims]}"
            for e in list(pre.evicted)[-20:]
        ]
        threading.Thread(
            target=pre.run, args=(api, stop), kwargs={"interval_s": preempt_interval_s}, daemon=True
        ).start()


def list_pods_or_exit(api: KubeApi) -> list[Any]:
    """Every pod; `UserError` when the API cannot list them."""
    from gpupool.adapters.k8s.kubeapi import KubeApiError

    try:
        return api.list_pods()[0]
    except KubeApiError as exc:
        raise UserError(f"cannot list pods from the Kubernetes API: {exc}") from None


def _sync_inventory(pool: object, api: object, names: object, every_s: float, stop: threading.Event) -> None:
    from gpupool.adapters.k8s.inventory import sync_from_nodes
    from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError
    from gpupool.adapters.k8s.pool import ExtenderPool
    from gpupool.adapters.k8s.resources import ResourceNames

    assert isinstance(pool, ExtenderPool) and isinstance(api, KubeApi) and isinstance(names, ResourceNames)
    log = logging.getLogger("gpupool.extender")
    while not stop.wait(every_s):
        try:
            report = sync_from_nodes(pool, api.list_nodes(), names)
        except KubeApiError as exc:
            log.warning("inventory resync: %s", exc)
            continue
        except Exception:  # a bad node object or a bug must not end the resync loop
            log.exception("inventory resync failed")
            continue
        if any(report.values()):
            log.info("inventory resync: %s", {k: v for k, v in report.items() if v})


NO_KUBE_API = "no Kubernetes API found; pass --kube-api/--kubeconfig, or --no-kube for a static dry run"


def kube_api_from_options(url: str, kubeconfig: str) -> KubeApi:
    """`KubeApi` of ``--kube-api``, else in-cluster, ``--kubeconfig`` or ``$KUBECONFIG``; or `UserError`."""
    from gpupool.adapters.k8s.kubeapi import KubeApi, KubeConfigError

    if url:
        check_url("--kube-api", url)
        return KubeApi.for_host(url)
    try:
        return KubeApi.from_environment(kubeconfig or None)
    except KubeConfigError as exc:
        if kubeconfig:
            raise UserError(f"invalid --kubeconfig={kubeconfig!r}: {exc}") from None
        raise UserError(NO_KUBE_API) from None


@user_errors
def extender(
    *,
    port: int = typer.Option(8888, "--port", help="TCP port (0 = pick a free one and print it)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (kube-scheduler runs beside it in the pod)."
    ),
    cluster: Path | None = typer.Option(None, "--cluster", help="Cluster spec YAML (static pool)."),
    workloads: Path | None = typer.Option(
        None, "--workloads", help="Workload spec YAML: use the plan's layout."
    ),
    prefix: str = typer.Option("", "--prefix", help="URL prefix of the verbs, e.g. /gpupool."),
    domain: str = typer.Option("gpupool.io", "--domain", help="Extended resource domain."),
    policy: str = typer.Option("bestfit", "--policy", help="Core placement policy (bestfit, spread, ...)."),
    kube_api: str = typer.Option(
        "", "--kube-api", help="Kubernetes API URL (default: in-cluster/kubeconfig)."
    ),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="kubeconfig file."),
    no_kube: bool = typer.Option(False, "--no-kube", help="No Kubernetes API: bind only commits the lease."),
    store: str = typer.Option(
        "memory:",
        "--store",
        help="Lease store of this extender's own ledger: memory:, sqlite:PATH, etcd://...",
    ),
    reconcile: bool = typer.Option(True, "--reconcile/--no-reconcile", help="Run the pod reconciler."),
    preempt_interval_s: float = typer.Option(
        5.0,
        "--preempt-interval-s",
        help="Seconds between preemption rounds for pending pods (0 = off).",
    ),
    inventory_resync_s: float = typer.Option(
        30.0,
        "--inventory-resync-s",
        help="Seconds between re-reads of node slice annotations (0 = off).",
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
) -> None:
    """Scheduler extender: filter / prioritize / bind / preempt for gpupool.io/vram-mib x compute-pct."""
    from gpupool.adapters.k8s.extender import Extender, ExtenderServer
    from gpupool.adapters.k8s.kubeapi import KubeApiError
    from gpupool.adapters.k8s.pool import ExtenderPool
    from gpupool.adapters.k8s.resources import ResourceNames
    from gpupool.cli.store_options import store_settings
    from gpupool.core.policies import get_policy
    from gpupool.hardware.slices import Slice

    check_port("--port", port)
    check_domain("--domain", domain)
    check_range("--preempt-interval-s", preempt_interval_s, lo=0)
    check_range("--inventory-resync-s", inventory_resync_s, lo=0)
    store_settings(store)  # the URL forms `serve --store` takes: a typo is not a SQLite file name
    level = check_log_level("--log-level", log_level)
    with options_named({"policy": "--policy"}):
        get_policy(policy)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if no_kube and (kube_api or kubeconfig):
        raise UserError("--no-kube excludes --kube-api and --kubeconfig")
    check_listen("--host/--port", host, port)  # before the API is asked or --store is opened
    names = ResourceNames(domain)
    api: KubeApi | None = None
    if not no_kube:
        api = kube_api_from_options(kube_api, kubeconfig)
    try:
        slices, source = build_slices(cluster, workloads, api=api, domain=domain)
    except KubeApiError as exc:
        raise UserError(f"cannot list nodes from the Kubernetes API: {exc}") from None
    controller = open_controller([s for s in slices if isinstance(s, Slice)], store_url=store, policy=policy)
    pool = ExtenderPool(controller)
    ext = Extender(pool, api=api, names=names)
    try:
        server = ExtenderServer(ext, host=host, port=port, prefix=prefix)
    except OSError as exc:
        raise UserError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    start_services(
        ext,
        api,
        source=source,
        reconcile=reconcile,
        preempt_interval_s=preempt_interval_s,
        inventory_resync_s=inventory_resync_s,
        stop=stop,
    )
    typer.echo(
        f"gpupool extender listening on {server.url} ({len(pool.nodes())} nodes, {len(slices)} slices from "
        f"{source})",
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()


@user_errors
def bench_extender(
    *,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    nodes: int = typer.Option(1000, "--nodes", help="Nodes in the pool."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="Whole H100-80GB cards per node."),
    samples: int = typer.Option(300, "--samples", help="Timed filter+prioritize pairs (one fresh pod each)."),
    fill: float = typer.Option(5.0, "--fill", help="Pre-filled leases per card on average."),
    seed: int = typer.Option(1, "--seed", help="Random seed of the fill and the pods."),
) -> None:
    """Extender latency: POST /filter + /prioritize for one pod over NODES x GPUS (real HTTP, JSON)."""
    from gpupool.bench import extender_bench

    if nodes < 1 or gpus_per_node < 1 or samples < 1:
        raise UserError("--nodes, --gpus-per-node and --samples must be >= 1")
    if not 0 <= fill <= 64:  # also NaN
        raise UserError(f"invalid --fill={fill}: must be in [0, 64] leases per card")
    result = extender_bench.run(
        nodes=nodes, gpus_per_node=gpus_per_node, samples=samples, fill_per_card=fill, seed=seed
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        typer.echo(
            f"{nodes} nodes x {gpus_per_node} GPUs: filter+prioritize "
            f"p50 {result['filter_prioritize_p50_ms']} ms, "
            f"p99 {result['filter_prioritize_p99_ms']} ms (in process p50 {result['in_process_p50_ms']} ms)"
        )
