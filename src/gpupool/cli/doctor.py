"""`gpupool doctor`: preflight of one GPU node, one line per check with what to do about it.

Checks (names as in the JSON): ``driver`` (>= 535.129), ``cuda`` (driver CUDA >= 12.2), per GPU
``gpu <id>`` (model, MIG capability, current and pending MIG mode, the mode discovery picks; a
pending MIG mode change fails it), ``mps-control`` (``nvidia-cuda-mps-control`` on PATH),
``mps-pipe-dir`` (exists or can be created, writable) and ``ipc-namespace`` (shared with the host, as
MPS clients need) when a GPU is served by MPS, ``kubelet-socket`` (``kubelet.sock`` in the
device-plugin directory; only with ``--kube`` or a ``--plugin-dir`` given: a bare host has no
kubelet), ``gpu-operator`` (NVIDIA mig-manager on this node or not: informational, it decides who
applies MIG layouts), ``clock-skew`` (against the gateway's ``Date``, at most ``MAX_SKEW_S``) and
``gateway`` (``GET /healthz``).

Output: ``--json`` prints ``{"checks": [{"name", "ok", "detail", "fix"}]}``; otherwise one line per
check. A check that does not apply here (no gateway given, no Kubernetes, no MPS GPU) passes with a detail
that says so. Exit code 0 when every check passes, 1 otherwise, 2 on bad arguments.

Invariants: doctor only reads (never changes MIG mode or starts daemons); each check is a pure
function of what was read (`run_checks`), so tests drive them with replayed NVML readings.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.errors import UserError, check_range, check_url, user_errors

MIN_DRIVER = (535, 129)
MIN_CUDA = 12020
"""``nvmlSystemGetCudaDriverVersion`` encoding: 1000 x major + 10 x minor (12020 = 12.2)."""
MAX_SKEW_S = 2.0
MPS_CONTROL = "nvidia-cuda-mps-control"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
MIG_MANAGER_LABELS = (
    "nvidia.com/gpu.deploy.mig-manager",
    "nvidia.com/mig.config.state",
    "nvidia.com/mig.config",
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """What doctor read from the machine (each field independently; None = could not be read)."""

    snapshot: Any = None
    """``DeviceSnapshot`` or None when the device source failed (see ``source_error``)."""
    source_error: str = ""
    simulated: bool = False
    mps_control: str | None = None
    mps_pipe_dir: str = "/tmp/nvidia-mps"  # noqa: S108 - NVIDIA's default MPS pipe directory
    ipc_self: str | None = None
    ipc_host: str | None = None
    ipc_error: str = ""
    plugin_dir: str = PLUGIN_DIR
    kubelet_expected: bool = True
    """Whether this node should run kubelet (``--kube`` or ``--plugin-dir`` given)."""
    node_labels: dict[str, str] | None = None
    kube_error: str = ""
    gateway: str = ""
    gateway_status: int | None = None
    gateway_error: str = ""
    skew_s: float | None = None
    inventory: Any = None
    notes: list[str] = field(default_factory=list)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def _driver(p: Probe) -> Check:
    fix = "install NVIDIA driver R535.129 or newer (R535 production branch or later)"
    if p.simulated:
        return Check("driver", True, "simulated devices: no driver to check")
    if p.snapshot is None:
        return Check("driver", False, f"NVML is not usable: {p.source_error}", fix + " and nvidia-ml-py")
    v = p.snapshot.driver_version
    ok = bool(_version(v)) and _version(v)[:2] >= MIN_DRIVER
    return Check(
        "driver", ok, f"driver {v or 'unknown'} (need >= {'.'.join(map(str, MIN_DRIVER))})", "" if ok else fix
    )


def _cuda(p: Probe) -> Check:
    if p.simulated:
        return Check("cuda", True, "simulated devices: no CUDA driver to check")
    if p.snapshot is None:
        return Check("cuda", False, f"NVML is not usable: {p.source_error}", "install the NVIDIA driver")
    v = int(p.snapshot.cuda_driver_version or 0)
    shown = f"{v // 1000}.{v % 1000 // 10}" if v else "unknown"
    ok = v >= MIN_CUDA
    fix = "" if ok else "upgrade the driver: its CUDA version must be 12.2 or newer"
    return Check("cuda", ok, f"driver CUDA {shown} (need >= 12.2)", fix)


def _gpus(p: Probe) -> list[Check]:
    if p.snapshot is None:
        return []
    if not p.snapshot.gpus:
        return [
            Check(
                "gpus",
                False,
                "no GPU found",
                "check the driver (nvidia-smi) and the container's device access",
            )
        ]
    views = {g.gpu_id: g for g in p.inventory.gpus} if p.inventory is not None else {}
    out = []
    for g in sorted(p.snapshot.gpus, key=lambda g: g.index):
        gid = f"{p.snapshot.node}/{g.index}"
        v = views.get(gid)
        cap = "MIG-capable" if v is not None and _mig_capable(g.model) else "no MIG"
        mode = "on" if g.mig_enabled else "off"
        pending = "unknown" if g.mig_pending is None else ("on" if g.mig_pending else "off")
        detail = (
            f"{g.name or g.model or '?'} {g.pci_bus_id or ''} {cap}, MIG {mode} (pending {pending}); "
            f"{len(g.mig_devices)} MIG instance(s); served as {v.mode if v is not None else '?'}"
        )
        if not g.healthy:
            out.append(
                Check(
                    f"gpu {gid}",
                    False,
                    f"{detail}; unreadable: {g.error}",
                    "check the GPU (XID in dmesg), reset or replace it",
                )
            )
            continue
        if g.mig_pending is not None and g.mig_pending != g.mig_enabled:
            fix = (
                f"stop every process on GPU {g.index}, then reset it (nvidia-smi -r -i {g.index}) or reboot "
                "to apply the pending MIG mode"
            )
            out.append(Check(f"gpu {gid}", False, detail + "; a MIG mode change is pending", fix))
            continue
        out.append(Check(f"gpu {gid}", True, detail))
    return out


def _mig_capable(model: str) -> bool:
    from gpupool.hardware.catalogue import UnknownGpuModelError, gpu_model

    try:
        return gpu_model(model).mig_capable if model else False
    except UnknownGpuModelError:
        return False


def _needs_mps(p: Probe) -> bool:
    return p.inventory is not None and any(g.mode == "mps" for g in p.inventory.gpus)


def _mps_control(p: Probe) -> Check:
    if not _needs_mps(p):
        return Check("mps-control", True, "not needed: no GPU here is served by MPS")
    if p.mps_control:
        return Check("mps-control", True, f"{MPS_CONTROL} at {p.mps_control}")
    return Check(
        "mps-control",
        False,
        f"{MPS_CONTROL} is not on PATH",
        "install the NVIDIA driver utilities (they ship nvidia-cuda-mps-control) or mount them in the agent",
    )


def _mps_pipe_dir(p: Probe) -> Check:
    d = Path(p.mps_pipe_dir)
    if not _needs_mps(p):
        return Check("mps-pipe-dir", True, f"not needed: no GPU here is served by MPS ({d})")
    if d.is_dir():
        ok = os.access(d, os.W_OK | os.X_OK)
        fix = "" if ok else f"make {d} writable by the agent (hostPath mount, owner root)"
        return Check("mps-pipe-dir", ok, f"{d} exists{'' if ok else ' but is not writable'}", fix)
    parent = next((a for a in d.parents if a.exists()), None)
    ok = parent is not None and parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    fix = "" if ok else f"create {d} (mkdir -p) or mount it as a hostPath shared with the containers"
    return Check("mps-pipe-dir", ok, f"{d} does not exist{'; it can be created' if ok else ''}", fix)


def _ipc(p: Probe) -> Check:
    if not _needs_mps(p):
        return Check("ipc-namespace", True, "not needed: no GPU here is served by MPS")
    fix = (
        "run the agent and MPS client pods with hostIPC: true (MPS needs a shared IPC namespace and /dev/shm)"
    )
    if p.ipc_self is None or p.ipc_host is None:  # unknown, not known to be separate: say what to check
        check = (
            "could not compare: check that the agent and MPS client pods run with hostIPC: true"
            " (MPS needs a shared IPC namespace and /dev/shm), or make the comparison possible (above)"
        )
        return Check("ipc-namespace", False, f"cannot compare IPC namespaces: {p.ipc_error}", check)
    ok = p.ipc_self == p.ipc_host
    detail = f"this process {p.ipc_self}, host init {p.ipc_host}: {'shared' if ok else 'separate'}"
    return Check("ipc-namespace", ok, detail, "" if ok else fix)


def _kubelet(p: Probe) -> Check:
    if not p.kubelet_expected:
        return Check("kubelet-socket", True, "no --kube: not checked (a bare host runs no kubelet)")
    sock = Path(p.plugin_dir) / "kubelet.sock"
    try:
        ok = stat.S_ISSOCK(sock.stat().st_mode)
        detail = f"{sock} {'is a socket' if ok else 'is not a socket'}"
    except OSError as exc:
        ok, detail = False, f"{sock}: {exc.strerror or exc}"
    fix = "" if ok else "mount /var/lib/kubelet/device-plugins into the pod and check that kubelet runs"
    return Check("kubelet-socket", ok, detail, fix)


def _operator(p: Probe) -> Check:
    if p.node_labels is None:
        return Check("gpu-operator", True, f"no Kubernetes API: not checked ({p.kube_error or 'not asked'})")
    found = {k: v for k, v in p.node_labels.items() if k in MIG_MANAGER_LABELS}
    if found:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(found.items()))
        if found.get("nvidia.com/mig.config.state") == "failed":
            return Check(
                "gpu-operator",
                False,
                f"mig-manager present, last change failed ({shown})",
                "read the nvidia-mig-manager pod's log on this node",
            )
        return Check(
            "gpu-operator",
            True,
            f"mig-manager present ({shown}): MIG layouts go through its ConfigMap and node label",
        )
    return Check(
        "gpu-operator", True, "no GPU Operator mig-manager on this node: MIG layouts are applied through NVML"
    )


def _gateway(p: Probe) -> list[Check]:
    if not p.gateway:
        return [
            Check("clock-skew", True, "no --gateway: not checked"),
            Check("gateway", True, "no --gateway: not checked"),
        ]
    fix = f"check that {p.gateway} is reachable from this node (Service, NetworkPolicy, TLS)"
    if p.gateway_status is None:
        return [
            Check("clock-skew", False, f"gateway unreachable: {p.gateway_error}", fix),
            Check("gateway", False, f"GET {p.gateway}/healthz: {p.gateway_error}", fix),
        ]
    ok = p.gateway_status == 200
    gw = Check("gateway", ok, f"GET {p.gateway}/healthz: HTTP {p.gateway_status}", "" if ok else fix)
    if p.skew_s is None:
        return [
            Check(
                "clock-skew",
                False,
                "the gateway sent no Date header",
                "put the gateway behind a proxy that keeps Date",
            ),
            gw,
        ]
    skew_ok = abs(p.skew_s) <= MAX_SKEW_S
    skew = Check(
        "clock-skew",
        skew_ok,
        f"{p.skew_s:+.1f} s against the gateway (at most {MAX_SKEW_S:g} s)",
        "" if skew_ok else "synchronise the clocks (chrony/NTP) of this node and the control plane",
    )
    return [skew, gw]


CHECKS: tuple[Callable[[Probe], Check | list[Check]], ...] = (
    _driver,
    _cuda,
    _gpus,
    _mps_control,
    _mps_pipe_dir,
    _ipc,
    _kubelet,
    _operator,
    _gateway,
)


def run_checks(p: Probe) -> list[Check]:
    out: list[Check] = []
    for fn in CHECKS:
        r = fn(p)
        out += r if isinstance(r, list) else [r]
    return out


# ---------------------------------------------------------------------- reading the machine
def _read_devices(devices: str, node: str) -> tuple[Any, str, str]:
    """(snapshot, error, node) from ``nvml`` or ``simulated``."""
    if devices == "simulated":
        from gpupool.adapters.simulated import embedded_default

        cluster = embedded_default()
        name = node if node in cluster.nodes() else sorted(cluster.nodes())[0]
        return cluster.source(name).read(), "", name
    from gpupool.adapters.nvml import NvmlDeviceSource

    src = NvmlDeviceSource(node, events=False)
    try:
        return src.read(), "", node
    except Exception as exc:  # NOTE: no library, no driver, no permission: all reported, not raised
        return None, f"{type(exc).__name__}: {exc}", node
    finally:
        with contextlib.suppress(Exception):  # closing a source that never opened
            src.close()


def _ipc_links(euid: int | None = None) -> tuple[str | None, str | None, str]:
    try:
        mine = str(Path("/proc/self/ns/ipc").readlink())
    except OSError as exc:
        return None, None, f"/proc/self/ns/ipc: {exc.strerror or exc}"
    try:
        host = str(Path("/proc/1/ns/ipc").readlink())
    except OSError as exc:
        return mine, None, f"/proc/1/ns/ipc: {exc.strerror or exc}{_why_unreadable(exc, euid)}"
    return mine, host, ""


def _why_unreadable(exc: OSError, euid: int | None = None) -> str:
    """What to do about an unreadable ``/proc/1/ns/ipc``: as another user, run as root; as root
    (``euid`` 0) it is denied by ptrace access rules, which running as root does not change."""
    if not isinstance(exc, PermissionError):
        return ""
    if (os.geteuid() if euid is None else euid) != 0:
        return " (run as root to compare)"
    return (
        " even to root: reading pid 1's namespaces needs ptrace access to it (CAP_SYS_PTRACE,"
        " which containers drop by default, or a Yama/AppArmor/SELinux policy refuses it)"
    )


def _probe_gateway(url: str, timeout_s: float) -> tuple[int | None, str, float | None]:
    import httpx

    try:
        t0 = time.time()
        resp = httpx.get(f"{url.rstrip('/')}/healthz", timeout=timeout_s)
        t1 = time.time()
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}", None
    date = resp.headers.get("date")
    skew: float | None = None
    if date:
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
            skew = (t0 + t1) / 2 - server - 0.5  # Date has 1 s resolution: compare with its midpoint
        except (TypeError, ValueError):
            skew = None
    return resp.status_code, "", skew


def _node_labels(node: str, kube_api: str, kubeconfig: str) -> tuple[dict[str, str] | None, str]:
    from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError, KubeConfigError

    try:
        api = KubeApi.for_host(kube_api) if kube_api else KubeApi.from_environment(kubeconfig or None)
    except KubeConfigError as exc:
        if kubeconfig:  # asked for by name: bad input, not "no Kubernetes API here"
            raise UserError(f"invalid --kubeconfig={kubeconfig!r}: {exc}") from None
        return None, str(exc)
    try:
        obj = api.read_node(node)
    except KubeApiError as exc:
        return None, str(exc)
    return dict((obj.get("metadata") or {}).get("labels") or {}), ""


@user_errors
def doctor(
    *,
    devices: str = typer.Option("nvml", "--devices", help="Device source: nvml | simulated."),
    node: str = typer.Option(
        "", "--node", help="This node's name (default: $NODE_NAME, else the host name)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"checks": [{"name", "ok", "detail", "fix"}]}.'
    ),
    gateway: str = typer.Option(
        "", "--gateway", help="Gateway base URL to check (reachability, clock skew)."
    ),
    mps_pipe_dir: str = typer.Option("/tmp/nvidia-mps", "--mps-pipe-dir", help="MPS pipe directory."),  # noqa: S108
    plugin_dir: str = typer.Option(
        "",
        "--plugin-dir",
        help=f"kubelet device-plugin directory (default {PLUGIN_DIR}); its kubelet.sock is checked "
        "with --kube or when this is given.",
    ),
    kube: bool = typer.Option(
        False, "--kube", help="Read this node's labels (GPU Operator) from the Kubernetes API."
    ),
    kube_api: str = typer.Option("", "--kube-api", help="Kubernetes API URL (with --kube)."),
    kubeconfig: str = typer.Option("", "--kubeconfig", help="kubeconfig file (with --kube)."),
    timeout_s: float = typer.Option(3.0, "--timeout-s", help="Seconds to wait for the gateway."),
) -> None:
    """Preflight of this node: driver, CUDA, MIG per GPU, MPS, IPC, kubelet, GPU Operator, gateway."""
    from gpupool.agent.inventory import discover

    if devices not in ("nvml", "simulated"):
        raise UserError(f"invalid --devices={devices!r}: must be nvml or simulated")
    if gateway:
        check_url("--gateway", gateway)
    if kube_api:
        check_url("--kube-api", kube_api)
    check_range("--timeout-s", timeout_s, lo=0, lo_open=True, hi=60)
    node = node or os.environ.get("NODE_NAME", "") or socket.gethostname()
    snap, err, node = _read_devices(devices, node)
    ipc_self, ipc_host, ipc_err = _ipc_links()
    labels, kube_err = _node_labels(node, kube_api, kubeconfig) if kube else (None, "")
    status, gw_err, skew = _probe_gateway(gateway, timeout_s) if gateway else (None, "", None)
    probe = Probe(
        snapshot=snap,
        source_error=err,
        simulated=devices == "simulated",
        mps_control=shutil.which(MPS_CONTROL),
        mps_pipe_dir=mps_pipe_dir,
        ipc_self=ipc_self,
        ipc_host=ipc_host,
        ipc_error=ipc_err,
        plugin_dir=plugin_dir or PLUGIN_DIR,
        kubelet_expected=kube or bool(plugin_dir),
        node_labels=labels,
        kube_error=kube_err,
        gateway=gateway.rstrip("/"),
        gateway_status=status,
        gateway_error=gw_err,
        skew_s=skew,
        inventory=discover(snap, mps_pipe_dir=mps_pipe_dir) if snap is not None else None,
    )
    checks = run_checks(probe)
    emit(checks, as_json=as_json)
    raise typer.Exit(0 if all(c.ok for c in checks) else 1)


def emit(checks: Sequence[Check], *, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"checks": [asdict(c) for c in checks]}))
        return
    width = max(len(c.name) for c in checks)
    for c in checks:
        line = f"{'ok  ' if c.ok else 'FAIL'} {c.name:<{width}}  {c.detail}"
        typer.echo(line + (f"\n     {'':<{width}}  fix: {c.fix}" if c.fix else ""))
