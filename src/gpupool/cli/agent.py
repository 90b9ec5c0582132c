"""`gpupool agent`: run the node agent (control loop, pausers, gateway reporting, /metrics).

With ``--gateway`` or ``--kube`` the agent also discovers its GPUs and publishes the node's slices
(`gpupool.agent.publish`): ``PUT /v1/nodes/{node}/slices`` on the gateway and the ``<domain>/slices``
node annotation through the Kubernetes API; ``--cluster``/``--workloads`` give the plan it adopts.

Every option is checked before anything starts (exit 2 naming the option as typed, `OPTIONS`
mapping the core's field names to options): a named ``--cluster`` / ``--workloads`` file is read
and planned at start whatever the other options, so a missing or invalid one is never ignored."""

from __future__ import annotations

import errno
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.errors import (
    UserError,
    check_domain,
    check_range,
    check_token,
    check_url,
    options_named,
    user_errors,
)

OPTIONS = {
    "devices": "--devices",
    "gpus": "--gpus",
    "watermarks.vram_high": "--vram-high",
    "watermarks.vram_low": "--vram-low",
    "agent.revoke_after_s": "--revoke-after-s",
    "engine": "--engine",
    "workload": "--workload",
    "mps": "--mps",
    "mps_pipe_dir": "--mps-pipe-dir",
}
"""The core's names of the fields the options set: its errors name the option instead."""


@user_errors
@options_named(OPTIONS)
def agent(
    *,
    gateway: str = typer.Option(
        "", "--gateway", help="Gateway base URL (http://host:port); empty = standalone."
    ),
    token: str = typer.Option(
        "", "--token", envvar="GPUPOOL_AGENT_TOKEN", help="Bearer token the gateway expects from this agent."
    ),
    node: str = typer.Option(..., "--node", help="Node name (as in the gateway's inventory)."),
    devices: str = typer.Option("simulated", "--devices", help="Device source: nvml | simulated | scripted."),
    gpus: int = typer.Option(2, "--gpus", help="GPUs of the in-memory node (simulated/scripted)."),
    period_ms: int = typer.Option(200, "--period-ms", help="Control-loop period in milliseconds."),
    vram_high: float = typer.Option(0.88, "--vram-high", help="Pause P2 at or above this VRAM ratio."),
    vram_low: float = typer.Option(0.70, "--vram-low", help="Resume P2 at or below this VRAM ratio."),
    revoke_after_s: float = typer.Option(
        5.0,
        "--revoke-after-s",
        help="Revoke P2 leases not freeing VRAM within this time (<0: never).",
    ),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address of the /metrics server."),
    metrics_port: int = typer.Option(9400, "--metrics-port", help="/metrics port (0 = any free, -1 = off)."),
    engine: list[str] = typer.Option(
        [],
        "--engine",
        help="vLLM-style engine: gpu=<node>/<index>,url=<http url>[,reserved_mib=<int>] (repeatable).",
    ),
    workload: list[str] = typer.Option(
        [],
        "--workload",
        help="Local P2 workload: lease=..,gpu=<node>/<index>,pauser=signal,pgid=.. (repeatable).",
    ),
    mps: list[str] = typer.Option(
        [],
        "--mps",
        help=(
            "MPS-shared GPU: gpu=<node>/<index>,pipe=<dir>[,device=<ordinal|UUID>][,socket=..] (repeatable)."
        ),
    ),
    evict_grace_ms: int = typer.Option(
        500,
        "--evict-grace-ms",
        help="When a ledger lease ends: SIGTERM its holder, SIGKILL after this grace (-1: do not act).",
    ),
    mps_daemons: bool = typer.Option(
        False,
        "--mps-daemons",
        envvar="GPUPOOL_MPS_DAEMONS",
        help="Start and supervise nvidia-cuda-mps-control -d per --mps GPU (restart on exit or fault XID); "
        "without --mps, one per GPU discovered as MPS at start, pipe dir <--mps-pipe-dir>/<index>.",
    ),
    mps_log_dir: str = typer.Option(
        "/var/log/nvidia-mps",
        "--mps-log-dir",
        help="Root of the per-GPU CUDA_MPS_LOG_DIRECTORY (--mps-daemons).",
    ),
    duration_s: float = typer.Option(0.0, "--duration-s", help="Stop after N seconds (0 = until SIGTERM)."),
    kube: bool = typer.Option(
        False, "--kube", help="Write this node's <domain>/slices annotation through the Kubernetes API."
    ),
    kube_api: str = typer.Option(
        "", "--kube-api", help="Kubernetes API URL (default: in-cluster/kubeconfig)."
    ),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="kubeconfig file."),
    domain: str = typer.Option("gpupool.io", "--domain", help="Annotation domain (<domain>/slices)."),
    cluster: Path | None = typer.Option(
        None, "--cluster", help="Cluster spec YAML: this node's planned GPUs."
    ),
    workloads: Path | None = typer.Option(None, "--workloads", help="Workload spec YAML: the plan's layout."),
    mps_pipe_dir: str = typer.Option(
        "/tmp/nvidia-mps",  # noqa: S108 - NVIDIA's default MPS pipe directory
        "--mps-pipe-dir",
        help="MPS pipe directory published for MPS slices (per GPU: --mps pipe=...).",
    ),
    resync_s: float = typer.Option(30.0, "--resync-s", help="Re-publish unchanged slices every N seconds."),
    publish: bool = typer.Option(
        True,
        "--publish/--no-publish",
        help="Publish the node's slices (to --gateway and, with --kube, the node).",
    ),
) -> None:
    """Run the node agent: every --period-ms read the GPUs, feed the watermarks, pause/resume P2 work,
    report readings and events to the gateway and serve dcgm-exporter-compatible /metrics."""
    from gpupool.agent.engines import parse_engine_spec
    from gpupool.agent.evict import EvictionPolicy
    from gpupool.agent.loop import AgentConfig
    from gpupool.agent.mps import parse_mps_spec
    from gpupool.agent.runtime import build_runtime
    from gpupool.agent.workloads import parse_workload_spec
    from gpupool.cli.extender import kube_api_from_options
    from gpupool.core.watermarks import WatermarkConfig

    if not node.strip():
        raise UserError("invalid --node='': must be a non-empty node name")
    if not 10 <= period_ms <= 60_000:
        raise UserError(f"invalid --period-ms={period_ms}: must be in [10, 60000]")
    if gateway:
        check_url("--gateway", gateway)
    if gateway and not token:
        raise UserError("invalid --token='': a token is required with --gateway (or set GPUPOOL_AGENT_TOKEN)")
    if gateway:
        check_token("--token", token)
    if not -1 <= metrics_port <= 65535:
        raise UserError(f"invalid --metrics-port={metrics_port}: must be in [-1, 65535]")
    check_range("--duration-s", duration_s, lo=0)
    if not math.isfinite(revoke_after_s):
        raise UserError(f"invalid --revoke-after-s={revoke_after_s!r}: must be a number (< 0: never)")
    check_range("--vram-high", vram_high, lo=0, hi=1)
    check_range("--vram-low", vram_low, lo=0, hi=1)
    if not vram_low < vram_high:
        raise UserError(f"invalid --vram-low={vram_low!r}: must be < --vram-high ({vram_high!r})")
    check_range("--resync-s", resync_s, lo=0, lo_open=True)
    check_domain("--domain", domain)
    check_range("--evict-grace-ms", evict_grace_ms, lo=-1, hi=10_000)
    if not mps_pipe_dir.startswith("/"):  # published to pods, which mount it: relative means nothing there
        raise UserError(f"invalid --mps-pipe-dir={mps_pipe_dir!r}: must be an absolute directory")
    mps_specs = [parse_mps_spec(m) for m in mps]
    engine_specs = [parse_engine_spec(e) for e in engine]
    workload_specs = [parse_workload_spec(w) for w in workload]
    planned = _planned(node, cluster, workloads)  # named files are read whatever the other options
    source = None
    if mps_daemons and not mps_specs:  # one daemon per GPU discovery serves by MPS
        source, mps_specs = _discovered_mps(
            node,
            devices,
            gpus=gpus,
            planned=planned,
            pipe_root=mps_pipe_dir,
        )
    kube_client = kube_api_from_options(kube_api, kubeconfig) if kube else None
    config = AgentConfig(
        node,
        period_s=period_ms / 1000.0,
        watermarks=WatermarkConfig(vram_high=vram_high, vram_low=vram_low),
        revoke_after_s=None if revoke_after_s < 0 else revoke_after_s,
    )
    runtime = build_runtime(
        node=node,
        gateway=gateway or None,
        token=token,
        devices=devices,
        gpus=gpus,
        config=config,
        engines=engine_specs,
        workloads=workload_specs,
        source=source,
        mps=mps_specs,
        mps_log_root=mps_log_dir if mps_daemons else None,
        eviction=None if evict_grace_ms < 0 else EvictionPolicy(grace_s=evict_grace_ms / 1000),
        evict_pod=kube_client.evict_pod if kube_client is not None else None,
    )
    if publish and (gateway or kube):
        runtime.publishers.append(
            _publisher(
                node,
                runtime=runtime,
                gateway=gateway,
                token=token,
                kube=kube_client,
                domain=domain,
                planned=planned,
                mps_pipe_dir=mps_pipe_dir,
                mps_pipe_dirs={m.gpu_id: m.pipe_directory for m in mps_specs},
                resync_s=resync_s,
            )
        )
    try:
        samples = runtime.source.read()  # probe once: a missing NVML must be a clear error, not a silent loop
    except Exception as exc:
        raise UserError(f"invalid --devices={devices!r}: not usable here: {exc}") from exc
    _check_gpus(
        node, {s.gpu_id for s in samples}, engines=engine_specs, workloads=workload_specs, mps=mps_specs
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        runtime.start(metrics_host=metrics_host, metrics_port=None if metrics_port < 0 else metrics_port)
    except OSError as exc:  # (bound before anything starts: nothing to stop)
        why = f"cannot listen on {metrics_host}:{metrics_port}: {exc.strerror or exc}"
        if exc.errno == errno.EADDRINUSE:
            why += " (0: any free port, -1: off)"
            raise UserError(f"invalid --metrics-port={metrics_port}: {why}") from None
        raise UserError(f"invalid --metrics-host={metrics_host!r}: {why}") from None
    where = f", metrics http://{metrics_host}:{runtime.metrics_port}/metrics" if runtime.metrics_port else ""
    typer.echo(
        f"gpupool agent: node {node}, {devices} devices, period {period_ms} ms, "
        f"gateway {gateway or '(none)'}{where}, pid {os.getpid()}",
        err=True,
    )
    for name, why in runtime.pauser_status.items():
        typer.echo(f"  pauser {name}: {'available' if not why else 'unavailable (' + why + ')'}", err=True)
    try:
        done.wait(duration_s if duration_s > 0 else None)
    except KeyboardInterrupt:
        pass
    finally:
        runtime.stop()


def _check_gpus(node: str, known: set[str], *, engines: Any, workloads: Any, mps: Any) -> None:
    """`UserError` naming the option and the value when an ``--engine``, ``--workload`` or ``--mps``
    names a GPU the device source does not read on this node: the loop matches them by id
    (``<node>/<index>``), so such an entry would silently never apply."""
    for option, items in (("--engine", engines), ("--workload", workloads), ("--mps", mps)):
        for item in items:
            if item.gpu_id not in known:
                gpus = ", ".join(sorted(known))
                raise UserError(f"invalid {option} gpu={item.gpu_id!r}: not a GPU of node {node!r} ({gpus})")


def _planned(node: str, cluster: Path | None, workloads: Path | None) -> list[Any]:
    """This node's slices in the plan of ``--cluster`` (laid out by ``--workloads`` when given);
    a file that is missing or not a valid spec is a `UserError` naming its option."""
    from gpupool.cli.specfiles import load_cluster_file, load_workload_file
    from gpupool.hardware.planner import inventory_from_cluster, inventory_from_plan, plan

    if cluster is None:
        if workloads is not None:
            raise UserError("--workloads needs --cluster")
        return []
    try:
        spec = load_cluster_file(cluster)
    except (UserError, ValueError) as exc:  # (SpecError is a ValueError)
        raise UserError(f"--cluster: {exc}") from None
    names = [n.name for n in spec.nodes]
    if node not in names:  # legal (a node that joined after the plan), but never silent
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        print(
            f"gpupool agent: --node {node!r} is not a node of --cluster {cluster} (its nodes: {shown}): "
            "nothing is planned for it; its GPUs are served as discovered",
            file=sys.stderr,
        )
    if workloads is None:
        return [s for s in inventory_from_cluster(spec) if s.node == node]
    try:
        layout = plan(spec, load_workload_file(workloads))
    except (UserError, ValueError) as exc:  # (SpecError, PlanError: cannot be placed)
        raise UserError(f"--workloads: {exc}") from None
    return [s for s in inventory_from_plan(layout) if s.node == node]


def _discovered_mps(
    node: str,
    devices: str,
    *,
    gpus: int,
    planned: list[Any],
    pipe_root: str,
) -> tuple[Any, list[Any]]:
    """Read the GPUs once and give every GPU discovery serves by MPS its own daemon (``--mps-daemons``
    without ``--mps``): pipe directory ``<--mps-pipe-dir>/<index>``, device its UUID."""
    from gpupool.agent.devices import open_source
    from gpupool.agent.inventory import discover
    from gpupool.agent.mps import mps_gpus_of

    source = open_source(devices, node=node, gpus=gpus)
    try:
        source.read()
    except Exception as exc:
        raise UserError(f"invalid --devices={devices!r}: not usable here: {exc}") from exc
    snapshot = getattr(source, "last", None)
    if snapshot is None:  # a source without a hardware view: nothing to discover
        return source, []
    return source, mps_gpus_of(discover(snapshot, planned=planned).slices, pipe_root)


def _publisher(
    node: str,
    *,
    runtime: Any,
    gateway: str,
    token: str,
    kube: Any,
    domain: str,
    planned: list[Any],
    mps_pipe_dir: str,
    mps_pipe_dirs: dict[str, str],
    resync_s: float,
) -> Any:
    from gpupool.adapters.k8s.resources import ResourceNames
    from gpupool.agent.publish import SlicePublisher

    source = runtime.source
    return SlicePublisher(
        node,
        device_snapshot=lambda: getattr(source, "last", None),
        gateway=gateway or None,
        token=token,
        kube=kube,
        annotation=ResourceNames(domain).slices,
        planned=planned,
        mps_pipe_dir=mps_pipe_dir,
        mps_pipe_dirs=mps_pipe_dirs,
        resync_s=resync_s,
    )


@user_errors
def bench_agent(
    *,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    period_ms: int = typer.Option(200, "--period-ms", help="Control-loop period for the reaction runs."),
    gpus: int = typer.Option(8, "--gpus", help="GPUs of the node whose tick is timed."),
    workloads: int = typer.Option(4, "--workloads", help="P2 workloads per GPU."),
    ticks: int = typer.Option(2000, "--ticks", help="Ticks timed per case."),
    trials: int = typer.Option(40, "--trials", help="Watermark crossings timed on the real clock."),
    seed: int = typer.Option(1, "--seed", help="Seed of the crossing phases."),
    pauser: str = typer.Option(
        "signal", "--pauser", help="signal | cgroup (cgroup needs a writable cgroup v2)."
    ),
) -> None:
    """Tick cost per GPU and reaction time from a watermark crossing to the process being stopped."""
    import json

    from gpupool.bench import agent_bench

    for name, value, lo in (("--period-ms", period_ms, 10), ("--gpus", gpus, 1), ("--ticks", ticks, 1)):
        if value < lo:
            raise UserError(f"invalid {name}={value}: must be >= {lo}")
    if workloads < 0 or trials < 1:
        raise UserError(f"invalid --workloads={workloads} / --trials={trials}: need >= 0 / >= 1")
    if pauser not in ("signal", "cgroup"):
        raise UserError(f"invalid --pauser={pauser!r}: must be signal or cgroup")
    result = agent_bench.run(
        period_ms=period_ms,
        gpus=gpus,
        workloads=workloads,
        ticks=ticks,
        trials=trials,
        seed=seed,
        pauser=pauser,
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        r = result["reaction_ms"]
        typer.echo(
            f"tick {result['tick_ms_per_gpu']:.4f} ms/GPU ({gpus} GPUs); reaction p50 {r['p50']} ms, "
            f"p99 {r['p99']} ms, max {r['max']} ms at {period_ms} ms period"
        )
