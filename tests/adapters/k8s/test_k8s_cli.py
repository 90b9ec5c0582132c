"""`gpupool extender` as a real subprocess: static pools from spec files, live pools from node annotations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node, make_pod

from gpupool.adapters.k8s.annotations import encode_slices
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.core import Resources, Slice, SliceKind

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


@contextmanager
def run_extender(*args: str) -> Iterator[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "extender", "--port", "0", "--host", "127.0.0.1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def post(url: str, obj: Any) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(obj).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def url_of(line: str) -> str:
    return line.split("listening on ", 1)[1].split(" ", 1)[0]


def test_static_pool_from_cluster_and_workloads() -> None:
    cluster = str(EXAMPLES / "cluster-a100-l40s.yaml")
    with run_extender("--cluster", cluster, "--no-kube", "--prefix", "gp") as line:
        assert "from cluster-file" in line and "6 slices" in line
        url = url_of(line)
        pod = make_pod("llm", vram_mib=47000, compute_pct=40)
        out = post(f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b"]})
        assert out["NodeNames"] == ["gpu-a"] and "gpu-b" in out["FailedAndUnresolvableNodes"]
        m = pod["metadata"]
        assert post(
            f"{url}/bind",
            {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-a"},
        ) == {"Error": ""}
    with run_extender(
        "--cluster", cluster, "--workloads", str(EXAMPLES / "workloads-agent-platform.yaml"), "--no-kube"
    ) as line:
        assert "from plan" in line


def test_live_pool_from_node_annotations() -> None:
    api = FakeApiServer().start()
    try:
        slices = [
            Slice(f"n1/0/mps{i}", "n1", "n1/0", SliceKind.MPS, Resources(12288, 250), gpu_index=0)
            for i in range(4)
        ]
        api.add_node(make_node("n1"))
        KubeApi.for_host(api.url).annotate_node("n1", {"gpupool.io/slices": encode_slices(slices)})
        api.add_node(make_node("n2", {"gpupool.io/slices": "{broken"}))
        with run_extender("--kube-api", api.url, "--no-reconcile") as line:
            assert "1 nodes, 4 slices from node-annotations" in line
            url = url_of(line)
            pod = api.add_pod(make_pod("guard", vram_mib=4096, compute_pct=25))
            out = post(f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2"]})
            assert out["NodeNames"] == ["n1"]
            m = pod["metadata"]
            assert post(
                f"{url}/bind",
                {"PodName": "guard", "PodNamespace": "default", "PodUID": m["uid"], "Node": "n1"},
            ) == {"Error": ""}
            assert api.pod("default", "guard")["spec"]["nodeName"] == "n1"
    finally:
        api.stop()


def test_standalone_extender_keeps_pod_leases_in_its_store(tmp_path: Path) -> None:
    """``--store sqlite:PATH``: a bound pod's lease is recovered from the store after a restart (no
    Kubernetes API, so no annotation could bring it back), and a retried bind answers from it."""
    cluster = str(EXAMPLES / "cluster-a100-l40s.yaml")
    store = f"sqlite:{tmp_path / 'leases.db'}"
    pod = make_pod("llm", vram_mib=20000, compute_pct=30)
    m = pod["metadata"]
    bind = {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-a"}
    with run_extender("--cluster", cluster, "--no-kube", "--store", store) as line:
        url = url_of(line)
        post(f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
        assert post(f"{url}/bind", bind) == {"Error": ""}
        with urllib.request.urlopen(f"{url}/state", timeout=10) as resp:
            assert json.loads(resp.read())["pods"] == [m["uid"]]
    with run_extender("--cluster", cluster, "--no-kube", "--store", store) as line:
        url = url_of(line)
        with urllib.request.urlopen(f"{url}/state", timeout=10) as resp:
            assert json.loads(resp.read())["pods"] == [m["uid"]]
        post(f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
        assert post(f"{url}/bind", bind) == {"Error": ""}
        with urllib.request.urlopen(f"{url}/state", timeout=10) as resp:
            assert json.loads(resp.read())["pods"] == [m["uid"]]


def test_bad_cli_input_exits_2_with_one_line(tmp_path: Path) -> None:
    for args in (
        ["--cluster", str(tmp_path / "missing.yaml"), "--no-kube"],
        ["--no-kube"],
        ["--workloads", str(EXAMPLES / "workloads-agent-platform.yaml"), "--no-kube"],
        ["--cluster", str(EXAMPLES / "cluster-a100-l40s.yaml"), "--no-kube", "--port", "70000"],
        ["--cluster", str(EXAMPLES / "cluster-a100-l40s.yaml"), "--no-kube", "--store", "sqlite:"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "gpupool.cli.main", "extender", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "gpupool: error:" in proc.stderr


@pytest.mark.parametrize("store", ["memroy:", " ", "leases.db", "etcd://h:abc"])
def test_a_store_that_is_not_a_store_url_is_exit_2_creating_nothing(tmp_path: Path, store: str) -> None:
    """``--store`` takes what `gpupool serve --store` takes: a typo such as ``memroy:`` was opened
    as a SQLite file of that name in the working directory, and the extender served on it."""
    args = ["extender", "--cluster", str(EXAMPLES / "cluster-a100-l40s.yaml"), "--no-kube", "--port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", *args, "--store", store],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"invalid --store={store!r}" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_device_plugin_command_registers_with_kubelet(tmp_path: Path) -> None:
    import shutil
    import tempfile

    from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet

    from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb

    d = Path(tempfile.mkdtemp(prefix="gpcli", dir="/tmp"))
    kubelet = FakeKubelet(d).start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NODE_NAME": "gpu-b"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "device-plugin",
            "--cluster",
            str(EXAMPLES / "cluster-a100-l40s.yaml"),
            "--plugin-dir",
            str(d),
            "--no-kube",
            "--replicas",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert "2 cards" in proc.stdout.readline()
        req = kubelet.wait_registered(1, timeout_s=30)
        assert req.resource_name == "gpupool.io/gpu"
        channel, stub = kubelet.plugin(req.endpoint)
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=10)).devices) == 6
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        kubelet.stop(wipe=False)
        shutil.rmtree(d, ignore_errors=True)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "device-plugin",
            "--no-kube",
            "--plugin-dir",
            str(tmp_path),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NODE_NAME": ""},
    )
    assert bad.returncode == 2 and "--node" in bad.stderr


def test_extender_adopts_bound_pods_before_serving() -> None:
    from gpupool.adapters.k8s.annotations import PlacedGrant, Placement, encode_placement

    api = FakeApiServer().start()
    try:
        slices = [Slice("n1/0/mps0", "n1", "n1/0", SliceKind.MPS, Resources(12288, 250), gpu_index=0)]
        api.add_node(make_node("n1", {"gpupool.io/slices": encode_slices(slices)}))
        grant = PlacedGrant("n1/0/mps0", "n1/0", "", SliceKind.MPS, 0, "", 12288, 250, False)
        placement = Placement(
            "lease-1", "uid-1", "default", "old", "main", "n1", 100, False, 12288, 250, 1, (), (grant,), 1.0
        )
        api.add_pod(
            make_pod(
                "old",
                uid="uid-1",
                node="n1",
                phase="Running",
                annotations={"gpupool.io/placement": encode_placement(placement)},
            )
        )
        with run_extender("--kube-api", api.url) as line:
            url = url_of(line)
            with urllib.request.urlopen(f"{url}/state", timeout=10) as resp:
                state = json.loads(resp.read())
                assert state["pods"] == ["uid-1"] and state["drift"] == [] and state["evictions"] == []
            pod = make_pod("new", vram_mib=1024)
            out = post(f"{url}/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["n1"]})
            assert out["NodeNames"] == [] and "n1" in out["FailedAndUnresolvableNodes"]
    finally:
        api.stop()


def _extender(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "extender", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_without_any_kubernetes_config_the_extender_says_what_to_pass(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "no-such-kubeconfig"))
    proc = _extender("--cluster", str(EXAMPLES / "cluster-a100-l40s.yaml"), "--port", "0", env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "gpupool: error: no Kubernetes API found; pass --kube-api/--kubeconfig, or --no-kube for a static "
        "dry run"
    )
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n")
    proc = _extender("--kubeconfig", str(bad), "--port", "0", env=env)
    assert proc.returncode == 2 and f"invalid --kubeconfig='{bad}'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_unreachable_kube_api_is_one_line_not_a_traceback() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _extender("--kube-api", f"http://127.0.0.1:{port}", "--port", "0")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]  # NOTE: the HTTP client logs its retries before
    assert last.startswith("gpupool: error: cannot list nodes from the Kubernetes API"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_extender_binds_loopback_by_default() -> None:
    cluster = str(EXAMPLES / "cluster-a100-l40s.yaml")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpupool.cli.main",
            "extender",
            "--port",
            "0",
            "--cluster",
            cluster,
            "--no-kube",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_bad_numeric_options_name_the_option() -> None:
    cluster = str(EXAMPLES / "cluster-a100-l40s.yaml")
    for args, want in (
        (["--port", "70000"], "invalid --port=70000: must be in [0, 65535]"),
        (["--port", "-1"], "invalid --port=-1: must be in [0, 65535]"),
        (["--preempt-interval-s", "-5"], "invalid --preempt-interval-s=-5.0: must be >= 0"),
        (["--inventory-resync-s", "nan"], "invalid --inventory-resync-s=nan: must be >= 0"),
        (["--log-level", "loud"], "invalid --log-level='loud'"),
    ):
        proc = _extender("--cluster", cluster, "--no-kube", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith(f"gpupool: error: {want}"), (args, proc.stderr)
