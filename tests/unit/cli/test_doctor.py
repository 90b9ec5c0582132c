"""`gpupool doctor`: each check on replayed NVML readings (hand-written fixtures through the real
`NvmlDeviceSource`), and the command itself as a real subprocess against a real gateway, a real
unix socket standing for kubelet's, and the fake Kubernetes API server's node labels."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.nvml import FakeNvml, NvmlDeviceSource
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.inventory import discover
from gpupool.cli.demo import seed_example_pool
from gpupool.cli.doctor import Probe, run_checks
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from tests.adapters.http.servers import running
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"


def _fixture(name: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / name).read_text()))


def _probe(fixture: dict[str, Any], **kw: Any) -> Probe:
    src = NvmlDeviceSource("n1", nvml=FakeNvml(copy.deepcopy(fixture)), events=False)
    snap = src.read()
    src.close()
    base: dict[str, Any] = {
        "snapshot": snap,
        "inventory": discover(snap),
        "mps_control": "/usr/bin/nvidia-cuda-mps-control",
        "ipc_self": "ipc:[4026531839]",
        "ipc_host": "ipc:[4026531839]",
    }
    return Probe(**{**base, **kw})


def _by_name(p: Probe) -> dict[str, Any]:
    return {c.name: c for c in run_checks(p)}


def test_driver_and_cuda_versions() -> None:
    fx = _fixture("h100-sxm5-mig-me-pending.json")
    checks = _by_name(_probe(fx))
    assert checks["driver"].ok and "535.129.03" in checks["driver"].detail
    assert checks["cuda"].ok and "12.2" in checks["cuda"].detail
    old = {**fx, "driver_version": "535.104.05", "cuda_driver_version": 12000}
    checks = _by_name(_probe(old))
    assert not checks["driver"].ok and "535.129" in checks["driver"].fix
    assert not checks["cuda"].ok and "12.0" in checks["cuda"].detail and checks["cuda"].fix
    del old["cuda_driver_version"]  # a driver that cannot say
    assert not _by_name(_probe(old))["cuda"].ok


def test_mig_capability_mode_and_pending_change_per_gpu() -> None:
    checks = _by_name(_probe(_fixture("h100-sxm5-mig-me-pending.json")))
    g0, g1 = checks["gpu n1/0"], checks["gpu n1/1"]
    assert g0.ok and "MIG-capable, MIG on (pending on)" in g0.detail and "00000000:18:00.0" in g0.detail
    assert not g1.ok and "pending" in g1.detail and "nvidia-smi -r -i 1" in g1.fix


def test_a_lost_gpu_fails_its_check() -> None:
    checks = _by_name(_probe(_fixture("gpu-lost.json")))
    assert checks["gpu n1/0"].ok and not checks["gpu n1/1"].ok


def test_mps_checks_apply_only_where_a_gpu_is_served_by_mps(tmp_path: Path) -> None:
    fx = _fixture("l40s.json")
    assert _by_name(_probe(fx, mps_pipe_dir=str(tmp_path / "mps")))["mps-pipe-dir"].ok  # can be created
    missing = _by_name(_probe(fx, mps_control=None))["mps-control"]
    assert not missing.ok and "nvidia-cuda-mps-control" in missing.detail and missing.fix
    (tmp_path / "ro").mkdir(mode=0o500)
    ro = _by_name(_probe(fx, mps_pipe_dir=str(tmp_path / "ro")))["mps-pipe-dir"]
    if not _is_root():  # root may write anywhere
        assert not ro.ok and "not writable" in ro.detail
    nompsneeded = _by_name(_probe(_fixture("a100-80gb-mig-3g40-2x1g10.json"), mps_control=None))
    assert nompsneeded["mps-control"].ok and "not needed" in nompsneeded["mps-control"].detail


def _is_root() -> bool:
    import os

    return os.geteuid() == 0


def test_ipc_namespace_must_be_the_hosts() -> None:
    fx = _fixture("l40s.json")
    apart = _by_name(_probe(fx, ipc_host="ipc:[4026532000]"))["ipc-namespace"]
    assert not apart.ok and "hostIPC" in apart.fix
    unknown = _by_name(_probe(fx, ipc_host=None, ipc_error="/proc/1/ns/ipc: Permission denied"))
    assert not unknown["ipc-namespace"].ok and "Permission denied" in unknown["ipc-namespace"].detail
    # not compared, so not known to be separate: the fix says to check, not that hostIPC is missing
    assert unknown["ipc-namespace"].fix.startswith("could not compare: check that")
    assert "hostIPC: true" in unknown["ipc-namespace"].fix
    # without a GPU served by MPS nothing needs the host's IPC namespace (it failed a bare host
    # without MPS, so doctor could never pass there)
    no_mps = _probe(_fixture("a100-80gb-mig-3g40-2x1g10.json"), ipc_host=None, ipc_error="Permission denied")
    assert _by_name(no_mps)["ipc-namespace"].ok and "not needed" in _by_name(no_mps)["ipc-namespace"].detail


def test_gpu_operator_presence_and_clock_skew() -> None:
    fx = _fixture("l40s.json")
    labels = {"nvidia.com/gpu.deploy.mig-manager": "true", "nvidia.com/mig.config.state": "success"}
    op = _by_name(_probe(fx, node_labels=labels))["gpu-operator"]
    assert op.ok and "mig-manager present" in op.detail
    bad = _by_name(_probe(fx, node_labels={**labels, "nvidia.com/mig.config.state": "failed"}))[
        "gpu-operator"
    ]
    assert not bad.ok and bad.fix
    assert "no GPU Operator" in _by_name(_probe(fx, node_labels={}))["gpu-operator"].detail
    gw = {"gateway": "http://gw:8080", "gateway_status": 200}
    assert _by_name(_probe(fx, **gw, skew_s=0.4))["clock-skew"].ok
    late = _by_name(_probe(fx, **gw, skew_s=-7.5))["clock-skew"]
    assert not late.ok and "-7.5 s" in late.detail and "NTP" in late.fix
    down = _by_name(_probe(fx, gateway="http://gw:8080", gateway_error="ConnectError: refused"))
    assert not down["gateway"].ok and not down["clock-skew"].ok


# ---------------------------------------------------------------------- the command
@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    store = SqliteLeaseStore(tmp_path / "l.db")
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=store)
    with running(
        create_app(c, tokens=TokenTable([("admin-token-0001", "ops", "admin")]), tick_s=0.05)
    ) as url:
        yield url
    store.close()


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpdr", dir="/tmp"))  # unix socket paths must stay < 108 bytes
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(d / "kubelet.sock"))
    yield d
    s.close()
    (d / "kubelet.sock").unlink()
    d.rmdir()


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_doctor_on_simulated_devices_as_json(gateway: str, kubelet_dir: Path, tmp_path: Path) -> None:
    api = FakeApiServer().start()
    node = make_node("gpu-a")
    node["metadata"]["labels"] = {"nvidia.com/gpu.deploy.mig-manager": "true"}
    api.add_node(node)
    try:
        out = doctor(
            "--devices", "simulated", "--node", "gpu-a", "--json", "--gateway", gateway,
            "--plugin-dir", str(kubelet_dir), "--mps-pipe-dir", str(tmp_path / "mps"),
            "--kube", "--kube-api", api.url,
        )  # fmt: skip
    finally:
        api.stop()
    checks = json.loads(out.stdout)["checks"]
    assert all(set(c) == {"name", "ok", "detail", "fix"} for c in checks)
    by = {c["name"]: c for c in checks}
    assert {"driver", "cuda", "mps-control", "mps-pipe-dir", "ipc-namespace", "kubelet-socket"} <= set(by)
    assert {"gpu-operator", "clock-skew", "gateway", "gpu gpu-a/0"} <= set(by)
    assert by["gateway"]["ok"] and by["clock-skew"]["ok"] and by["kubelet-socket"]["ok"]
    assert by["gpu-operator"]["ok"] and "mig-manager present" in by["gpu-operator"]["detail"]
    assert "MIG on" in by["gpu gpu-a/0"]["detail"]
    assert out.returncode == (0 if all(c["ok"] for c in checks) else 1), out.stderr


def test_doctor_lines_and_exit_1_when_a_check_fails(tmp_path: Path) -> None:
    out = doctor("--devices", "simulated", "--plugin-dir", str(tmp_path), "--gateway", "http://127.0.0.1:9")
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("FAIL kubelet-socket") for line in lines)
    assert any(line.startswith("FAIL gateway") for line in lines)
    assert any("fix: mount /var/lib/kubelet/device-plugins" in line for line in lines)


def test_a_bare_host_without_kube_passes_doctor_as_the_docs_show(tmp_path: Path) -> None:
    """docs/ops/node-discovery.md: `gpupool doctor --devices simulated --json` exits 0 when all
    pass, and checks that do not apply (no --kube) pass and say so. A bare host has no kubelet: the
    kubelet socket is checked only with --kube or a --plugin-dir given (it failed every bare host)."""
    out = doctor("--devices", "simulated", "--json", "--mps-pipe-dir", str(tmp_path / "mps"))
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    kubelet = by["kubelet-socket"]
    assert kubelet["ok"] and "not checked" in kubelet["detail"], kubelet
    assert out.returncode == 0, out.stdout
    kube_dir = tmp_path / "plugins"  # named by the user: checked (and absent here)
    out = doctor("--devices", "simulated", "--json", "--plugin-dir", str(kube_dir))
    by = {c["name"]: c for c in json.loads(out.stdout)["checks"]}
    assert not by["kubelet-socket"]["ok"] and str(kube_dir) in by["kubelet-socket"]["detail"]
    assert out.returncode == 1


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--devices", "scripted"], "--devices='scripted'"),
        (["--gateway", "gw:8080"], "--gateway='gw:8080'"),
        (["--timeout-s", "0"], "--timeout-s=0"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], want: str) -> None:
    out = doctor(*args)
    assert out.returncode == 2 and want in out.stderr, (out.returncode, out.stderr)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "cannot read it: No such file or directory"),
        ("root:x:0:0:root:/root:/bin/bash\n", "not a kubeconfig: expected a YAML mapping with clusters"),
        ("- 1\n", "not a kubeconfig: expected a YAML mapping with clusters"),
        ("clusters: [\n", "not YAML: expected the node content, but found '<stream end>' at line 2 column 1"),
    ],
)
def test_a_kubeconfig_named_by_the_user_that_is_not_one_is_exit_2_saying_why(
    tmp_path: Path, content: str | None, why: str
) -> None:
    """doctor --kube passed such a file as "no Kubernetes API: not checked"; agent, extender and the
    device plugin named the client library's internals ('str' object does not support item
    assignment)."""
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    want = f"gpupool: error: invalid --kubeconfig={str(path)!r}: {why}"
    for args in (
        ("doctor", "--devices", "simulated", "--kube"),
        ("agent", "--node", "n", "--metrics-port", "-1", "--kube"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", *args, "--kubeconfig", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 2 and r.stderr.strip().startswith(want), (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_an_unreadable_host_ipc_namespace_says_why_for_the_user_it_runs_as() -> None:
    """``run as root to compare`` only when not root: as root the denial comes from ptrace access
    rules (a container without CAP_SYS_PTRACE), and the advice was wrong there."""
    from gpupool.cli.doctor import _why_unreadable

    denied = PermissionError(13, "Permission denied")
    assert _why_unreadable(denied, euid=1000) == " (run as root to compare)"
    as_root = _why_unreadable(denied, euid=0)
    assert "run as root" not in as_root and "even to root" in as_root and "CAP_SYS_PTRACE" in as_root
    assert _why_unreadable(FileNotFoundError(2, "No such file or directory"), euid=1000) == ""
