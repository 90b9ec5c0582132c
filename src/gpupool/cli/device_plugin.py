"""`gpupool device-plugin`: the kubelet device plugin for ``<domain>/gpu`` on one node.

Cards: ``--cluster FILE [--workloads FILE]`` (this node's part of the static pool), else the node's
``<domain>/slices`` annotation read through the Kubernetes API (written by the node agent; until it
appears the plugin waits). With an API, one thread follows that annotation (card health in
ListAndWatch is the agent's health view, new cards are added), another watches this node's pods and
queues their bound placements for Allocate; every ``--verify-s`` seconds the
PodResources API (when its socket exists) confirms which pod got which cards. Stops on SIGTERM/^C.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from gpupool.adapters.mps import ContainerMps, MpsLimits, container_mps
from gpupool.cli.errors import UserError, check_domain, check_log_level, check_range, user_errors


def mps_client_side(
    pipe_directory: str, device: int | str, *, vram_mib: int, compute_milli: int, shm_directory: str = ""
) -> ContainerMps:
    """One MPS grant's container side, as NVIDIA's k8s-device-plugin gives it (`container_mps`)."""
    limits = MpsLimits.from_grant(vram_mib=vram_mib, compute_milli=compute_milli)
    return container_mps(pipe_directory, device, limits, shm_directory=shm_directory)


@user_errors
def device_plugin(
    *,
    node: str = typer.Option("", "--node", help="This node's name (default: $NODE_NAME)."),
    cluster: Path | None = typer.Option(None, "--cluster", help="Cluster spec YAML (static pool)."),
    workloads: Path | None = typer.Option(None, "--workloads", help="Workload spec YAML: the plan's layout."),
    plugin_dir: str = typer.Option(
        "/var/lib/kubelet/device-plugins", "--plugin-dir", help="kubelet socket dir."
    ),
    endpoint: str = typer.Option(
        "gpupool.sock", "--endpoint", help="Our socket's file name in --plugin-dir."
    ),
    replicas: int = typer.Option(
        16, "--replicas", help="Device IDs per card (pods that may share one card)."
    ),
    domain: str = typer.Option("gpupool.io", "--domain", help="Extended resource domain."),
    mps_pipe_dir: str = typer.Option("/tmp/nvidia-mps", "--mps-pipe-dir", help="CUDA MPS pipe directory."),  # noqa: S108
    mps_shm_dir: str = typer.Option(
        "",
        "--mps-shm-dir",
        help="Host directory the node's MPS daemons use as /dev/shm, mounted there in MPS containers "
        "(empty: the daemons share the host IPC namespace and MPS pods need hostIPC: true).",
    ),
    pod_resources_socket: str = typer.Option(
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "--pod-resources-socket",
        help="kubelet PodResources socket.",
    ),
    verify_s: float = typer.Option(10.0, "--verify-s", help="Seconds between PodResources checks."),
    node_poll_s: float = typer.Option(
        2.0, "--node-poll-s", help="Seconds between reads of this node's slice annotation (health)."
    ),
    kube_api: str = typer.Option(
        "", "--kube-api", help="Kubernetes API URL (default: in-cluster/kubeconfig)."
    ),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="kubeconfig file."),
    no_kube: bool = typer.Option(False, "--no-kube", help="No Kubernetes API (no pod feed: Allocate fails)."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error."),
) -> None:
    """Kubelet device plugin (v1beta1): advertise cards, hand containers the env of their bound lease."""
    from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of
    from gpupool.adapters.k8s.kubeapi import KubeApi
    from gpupool.adapters.k8s.resources import ResourceNames
    from gpupool.cli.extender import build_slices, kube_api_from_options
    from gpupool.hardware.slices import Slice

    level = check_log_level("--log-level", log_level)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    node = node or os.environ.get("NODE_NAME", "")
    if not node:
        raise UserError("--node is required (or set NODE_NAME)")
    if not 1 <= replicas <= 1024:
        raise UserError(f"--replicas {replicas}: must be in [1, 1024]")
    check_range("--verify-s", verify_s, lo=0, lo_open=True)
    check_domain("--domain", domain)
    check_range("--node-poll-s", node_poll_s, lo=0, lo_open=True)
    if not mps_pipe_dir.startswith("/"):  # mounted into containers: must name a host directory
        raise UserError(f"invalid --mps-pipe-dir={mps_pipe_dir!r}: must be an absolute directory")
    if mps_shm_dir and not mps_shm_dir.startswith("/"):
        raise UserError(f"--mps-shm-dir {mps_shm_dir}: must be an absolute directory")
    if not Path(plugin_dir).is_dir():
        raise UserError(f"--plugin-dir {plugin_dir}: no such directory")
    if endpoint in ("", ".", "..") or Path(endpoint).name != endpoint:  # kubelet dials <dir>/<endpoint>
        raise UserError(f"invalid --endpoint={endpoint!r}: must be a file name in --plugin-dir")
    if endpoint == "kubelet.sock":  # serving removes a stale socket of our name first
        raise UserError(f"invalid --endpoint={endpoint!r}: kubelet's own socket in --plugin-dir")
    api: KubeApi | None = None
    if not no_kube:
        api = kube_api_from_options(kube_api, kubeconfig)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    slices, _ = build_slices(cluster, workloads, api=api, domain=domain)
    cards = cards_of([s for s in slices if isinstance(s, Slice)], node)
    if not cards and (api is None or cluster is not None):
        raise UserError(f"node {node!r} has no GPUs in the inventory")
    if not cards:
        typer.echo(f"node {node!r} has no {domain}/slices annotation yet: waiting for its agent", err=True)
    while not cards and not stop.wait(node_poll_s):
        slices, _ = build_slices(None, None, api=api, domain=domain)
        cards = cards_of([s for s in slices if isinstance(s, Slice)], node)
    if not cards:
        return
    cfg = PluginConfig(
        node=node,
        names=ResourceNames(domain),
        plugin_dir=plugin_dir,
        endpoint=endpoint,
        replicas=replicas,
        mps_pipe_dir=mps_pipe_dir,
        mps_shm_dir=mps_shm_dir,
        pod_resources_socket=pod_resources_socket,
    )
    plugin = DevicePlugin(cfg, cards, mps=mps_client_side, api=api)
    if api is not None and cluster is None:
        # the pipe directories the agent published, read before kubelet can call Allocate: an
        # Allocate answered before the first read would get the default directory
        plugin.read_node_once(api, cfg.names.slices)
    plugin.start()
    if api is not None and cluster is None:
        threading.Thread(
            target=plugin.run_node_feed,
            args=(api, stop),
            kwargs={"every_s": node_poll_s},
            name="gpupool-dp-node",
            daemon=True,
        ).start()
    if api is not None:
        threading.Thread(
            target=plugin.run_pod_feed, args=(api, stop), name="gpupool-dp-pods", daemon=True
        ).start()
    typer.echo(f"gpupool device plugin for {cfg.names.gpu} on {node}: {len(cards)} cards at {cfg.socket}")
    try:
        while not stop.wait(verify_s):
            try:
                plugin.verify()
            except Exception as exc:  # NOTE: PodResources is optional; keep serving
                logging.getLogger("gpupool.device_plugin").warning("PodResources check failed: %s", exc)
    except KeyboardInterrupt:
        pass
    finally:
        plugin.stop()
