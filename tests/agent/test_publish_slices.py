"""The agent publishes what it discovered: a real `NodeAgent` over a stand-in node (hardware readings
that the test changes: GPUs added, removed, failed with an XID), a `SlicePublisher` sending to the real
gateway app over HTTP and to the fake Kubernetes API server (node annotation), and a real device
plugin whose ListAndWatch follows that annotation. Every change shows in both places within one
publish, and a lease on a vanished GPU is revoked with its holder told."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.k8s.annotations import decode_pipe_dirs, decode_slices
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.publish import SlicePublisher
from gpupool.agent.runtime import AgentRuntime
from gpupool.core.clock import FunctionClock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.hardware.devices import DeviceSnapshot, GpuReading, XidEvent
from gpupool.hardware.slices import Slice
from tests.adapters.http.servers import running
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet
from tests.agent.agent_helpers import wait_for

ADMIN, TENANT = "agent-admin-token-01", "tenant-a-token-0001"
NODE = "n1"
KEY = "gpupool.io/slices"


class Node:
    """Stands in for the node's NVML: a list of GPU readings the test edits, plus pending XIDs."""

    def __init__(self, gpus: list[GpuReading]) -> None:
        self.gpus = list(gpus)
        self.events: list[XidEvent] = []
        self.lock = threading.Lock()

    def read(self) -> DeviceSnapshot:
        with self.lock:
            events, self.events = self.events, []
            return DeviceSnapshot(
                NODE, time.monotonic(), tuple(self.gpus), tuple(events), "535.129.03", "test"
            )

    def close(self) -> None:
        pass


def h100(index: int) -> GpuReading:
    return GpuReading(
        index,
        f"GPU-h100-{index}",
        "NVIDIA H100 80GB HBM3",
        "H100-SXM5-80GB",
        81559,
        600,
        utilization_pct=0,
        temperature_c=40,
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
    )


def l40s(index: int) -> GpuReading:
    return GpuReading(index, f"GPU-l40s-{index}", "NVIDIA L40S", "L40S-48GB", 46068, 300, utilization_pct=0)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    store = SqliteLeaseStore(tmp_path / "leases.db")
    c = LeaseController([], clock=FunctionClock(time.time), store=store)
    c.recover()
    tokens = TokenTable([(ADMIN, "ops", "admin"), (TENANT, "a", "tenant")])
    with running(create_app(c, tokens=tokens, tick_s=0.05)) as url:
        yield url
    store.close()


@pytest.fixture
def kube() -> Iterator[FakeApiServer]:
    api = FakeApiServer().start()
    api.add_node(make_node(NODE))
    yield api
    api.stop()


def _gateway_slices(url: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{url}/v1/pool", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, dict[str, Any]] = {}
    for n in r.json()["nodes"]:
        for g in n["gpus"]:
            for s in g["slices"]:
                out[s["slice_id"]] = s
    return out


def _annotation(api: FakeApiServer) -> str:
    with api.lock:
        return str(api.nodes[NODE]["metadata"]["annotations"][KEY])


def _build(node: Node, gateway: str, api: FakeApiServer) -> tuple[NodeAgent, SlicePublisher]:
    source = SnapshotSource(node, node=NODE)
    agent = NodeAgent(AgentConfig(NODE), source, {}, clock=ManualClock())
    pub = SlicePublisher(
        NODE,
        device_snapshot=lambda: source.last,
        gateway=gateway,
        token=ADMIN,
        kube=KubeApi.for_host(api.url),
        mps_pipe_dirs={f"{NODE}/2": "/run/gpupool/mps-2"},
    )
    agent.observers.append(pub)
    return agent, pub


def _step(agent: NodeAgent, pub: SlicePublisher) -> None:
    """One tick and the publish it triggered (the worker's step, on this thread)."""
    agent.tick()
    assert pub.flush() == []


def test_changes_reach_gateway_and_annotation_in_one_publish(gateway: str, kube: FakeApiServer) -> None:
    node = Node([h100(0), h100(1), l40s(2)])
    agent, pub = _build(node, gateway, kube)
    _step(agent, pub)
    first = {"n1/0/whole", "n1/1/whole", "n1/2/mps-pool"}
    assert set(_gateway_slices(gateway)) == first
    ann = decode_slices(_annotation(kube), node=NODE)
    assert {s.id for s in ann} == first
    assert {s.id: s.uuid for s in ann}["n1/1/whole"] == "GPU-h100-1"
    assert decode_pipe_dirs(_annotation(kube)) == {"n1/2/mps-pool": "/run/gpupool/mps-2"}
    assert pub.last is not None and [g.pci_bus_id for g in pub.last.gpus][:2] == [
        "00000000:18:00.0",
        "00000000:19:00.0",
    ]

    r = httpx.post(
        f"{gateway}/v1/leases",
        headers={"Authorization": f"Bearer {TENANT}"},
        json={"priority": "P1", "vram_mib": 70000, "kinds": ["whole"], "ttl_s": 600},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    lease = r.json()
    held = lease["gpu_id"]
    other = "n1/1" if held == "n1/0" else "n1/0"

    with node.lock:  # the GPU holding the lease falls off the bus and is gone from NVML
        node.gpus = [g for g in node.gpus if f"{NODE}/{g.index}" != held]
    _step(agent, pub)
    assert f"{held}/whole" not in _gateway_slices(gateway)
    assert f"{held}/whole" not in {s.id for s in decode_slices(_annotation(kube), node=NODE)}
    got = httpx.get(
        f"{gateway}/v1/leases/{lease['id']}", headers={"Authorization": f"Bearer {TENANT}"}, timeout=10
    ).json()
    assert got["state"] == "revoked" and "vanished" in got["reason"]
    assert pub.last_report["revoked"] == [lease["id"]]

    with node.lock:  # an XID on the other card: the agent marks it unhealthy, both views follow
        node.events.append(XidEvent(f"GPU-h100-{other[-1]}", 79))
    _step(agent, pub)
    assert _gateway_slices(gateway)[f"{other}/whole"]["healthy"] is False
    assert {s.id: s.healthy for s in decode_slices(_annotation(kube), node=NODE)}[f"{other}/whole"] is False

    with node.lock:  # a GPU is added (hot-plugged, or the lost one came back after a reset)
        node.gpus.append(h100(3))
    _step(agent, pub)
    assert "n1/3/whole" in _gateway_slices(gateway)
    assert "n1/3/whole" in {s.id for s in decode_slices(_annotation(kube), node=NODE)}


def test_unchanged_slices_are_not_resent_until_the_resync(gateway: str, kube: FakeApiServer) -> None:
    node = Node([h100(0)])
    agent, pub = _build(node, gateway, kube)
    _step(agent, pub)
    agent.tick()
    assert pub.flush() == [] and pub.published == 1
    pub.resync_s = 0.0
    _step(agent, pub)
    assert pub.published == 2


def test_a_failed_send_is_retried(gateway: str, kube: FakeApiServer) -> None:
    node = Node([h100(0)])
    source = SnapshotSource(node, node=NODE)
    agent = NodeAgent(AgentConfig(NODE), source, {}, clock=ManualClock())
    pub = SlicePublisher(
        NODE, device_snapshot=lambda: source.last, kube=KubeApi.for_host(kube.url), retry_s=0.0
    )
    agent.observers.append(pub)
    with kube.lock:
        kube.nodes.pop(NODE)
    agent.tick()
    errors = pub.flush()
    assert errors and "404" in errors[0] and pub.published == 0
    kube.add_node(make_node(NODE))
    _step(agent, pub)
    assert pub.published == 1 and "n1/0/whole" in _annotation(kube)


def test_runtime_publishes_and_the_device_plugin_follows_health(gateway: str, kube: FakeApiServer) -> None:
    """The composition as deployed: the agent loop on its thread publishes through the worker; the
    device plugin reads the annotation and its ListAndWatch stream turns the failed card Unhealthy."""
    node = Node([h100(0), h100(1)])
    source = SnapshotSource(node, node=NODE)
    agent = NodeAgent(AgentConfig(NODE, period_s=0.02), source, {}, clock=FunctionClock(time.monotonic))
    api = KubeApi.for_host(kube.url)
    pub = SlicePublisher(NODE, device_snapshot=lambda: source.last, gateway=gateway, token=ADMIN, kube=api)
    rt = AgentRuntime(agent, source, publishers=[pub])
    rt.start(metrics_port=None)
    d = Path(tempfile.mkdtemp(prefix="gpdp", dir="/tmp"))  # unix socket paths must stay < 108 bytes
    kubelet = FakeKubelet(d).start()
    stop = threading.Event()
    plugin: DevicePlugin | None = None
    try:
        assert wait_for(lambda: KEY in kube.nodes[NODE]["metadata"].get("annotations", {}))
        cards = cards_of(decode_slices(_annotation(kube), node=NODE), NODE)
        plugin = DevicePlugin(PluginConfig(node=NODE, plugin_dir=str(d), replicas=2, poll_s=0.05), cards)
        plugin.start()
        feeder = threading.Thread(target=plugin.run_node_feed, args=(api, stop), kwargs={"every_s": 0.05})
        feeder.start()
        req = kubelet.wait_registered(1)
        channel, stub = kubelet.plugin(req.endpoint)
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert all(x.health == "Healthy" for x in next(stream).devices)
        with node.lock:
            node.events.append(XidEvent("GPU-h100-1", 48))
        second = next(stream)
        assert {x.ID for x in second.devices if x.health == "Unhealthy"} == {"n1_1-0", "n1_1-1"}
        assert _gateway_slices(gateway)["n1/1/whole"]["healthy"] is False
        channel.close()
    finally:
        stop.set()
        if plugin is not None:
            plugin.stop()
        kubelet.stop()
        rt.stop()
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


REPO = Path(__file__).resolve().parents[2]


def test_cli_agent_adopts_its_plan_and_annotates_its_node(kube: FakeApiServer) -> None:
    """``gpupool agent --kube --cluster --workloads`` as a real subprocess: the node annotation lists
    the planned slices of the simulated node (the plan adopted, nothing differs)."""
    import os
    import subprocess
    import sys

    from gpupool.cli.extender import build_slices

    kube.add_node(make_node("gpu-b"))
    cluster, workloads = (
        REPO / "examples" / "cluster-a100-l40s.yaml",
        REPO / "examples" / "workloads-agent-platform.yaml",
    )
    args = [
        sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "gpu-b", "--devices", "simulated",
        "--kube", "--kube-api", kube.url, "--cluster", str(cluster), "--workloads", str(workloads),
        "--metrics-port", "-1", "--period-ms", "50", "--duration-s", "30",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, env=dict(os.environ, PYTHONPATH=str(REPO / "src")), stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_for(lambda: KEY in kube.nodes["gpu-b"]["metadata"].get("annotations", {}), timeout_s=30)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    planned, _ = build_slices(cluster, workloads, api=None, domain="gpupool.io")
    want = {s.id for s in planned if isinstance(s, Slice) and s.node == "gpu-b"}
    got = decode_slices(kube.nodes["gpu-b"]["metadata"]["annotations"][KEY], node="gpu-b")
    assert {s.id for s in got} == want, err[-2000:]
    assert all(s.healthy for s in got)


def test_cli_agent_workloads_without_cluster_is_exit_2() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "gpupool.cli.main", "agent", "--node", "n", "--devices", "scripted",
         "--kube", "--kube-api", "http://127.0.0.1:9", "--workloads", "w.yaml", "--metrics-port", "-1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2 and "--workloads needs --cluster" in out.stderr, out.stderr
