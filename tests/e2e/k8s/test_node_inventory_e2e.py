"""From discovered hardware to a container's devices, without a cluster: the fake Kubernetes API
server, two simulated nodes (the embedded A100 MIG node and L40S node) each with a real node agent
publishing its discovery, the real gateway (control plane), the extender reading its inventory
from the node annotations, a device plugin per node (one in-process, one the real ``gpupool
device-plugin`` subprocess started before its agent published anything), each registered with a
fake kubelet over gRPC on unix sockets. A pod is filtered and bound as kube-scheduler's HTTPExtender
does, and Allocate hands its container the MIG device UUID the agent discovered; then a GPU fails
(XID 79) and the gateway, the annotation, the extender and ListAndWatch all follow."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.k8s.annotations import decode_placement, decode_slices
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.inventory import slices_from_nodes, sync_from_nodes
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.adapters.simulated import embedded_default
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.publish import SlicePublisher
from gpupool.core.clock import FunctionClock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.hardware.slices import SliceKind
from tests.adapters.http.servers import running
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node, make_pod
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet
from tests.adapters.k8s.k8s_helpers import Client, pool_of, wait_until

REPO = Path(__file__).resolve().parents[3]
ADMIN = "agent-admin-token-01"
KEY = "gpupool.io/slices"
PLACEMENT = "gpupool.io/placement"
PIPES = {"gpu-b/0": "/run/gpupool/mps-0", "gpu-b/1": "/run/gpupool/mps-1"}
"""The pipe directory of each L40S's MPS control daemon, as the agent publishes it."""


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    made = {n: Path(tempfile.mkdtemp(prefix=f"gpe2{n[-1]}", dir="/tmp")) for n in ("gpu-a", "gpu-b")}
    yield made
    for d in made.values():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


def test_discovered_gpus_reach_the_scheduler_and_the_container(dirs: dict[str, Path], tmp_path: Path) -> None:
    api_server = FakeApiServer().start()
    for n in ("gpu-a", "gpu-b"):
        api_server.add_node(make_node(n))
    api = KubeApi.for_host(api_server.url)
    store = SqliteLeaseStore(tmp_path / "leases.db")
    controller = LeaseController([], clock=FunctionClock(time.time), store=store)
    cluster = embedded_default()
    kubelets = {n: FakeKubelet(d).start() for n, d in dirs.items()}
    stop = threading.Event()
    threads: list[threading.Thread] = []
    plugin: DevicePlugin | None = None
    proc: subprocess.Popen[str] | None = None
    server: ExtenderServer | None = None
    try:
        with running(create_app(controller, tokens=TokenTable([(ADMIN, "ops", "admin")]), tick_s=0.05)) as gw:
            # the gpu-b device plugin starts first, as a DaemonSet container may: it waits for its agent
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpupool.cli.main", "device-plugin", "--node", "gpu-b",
                 "--plugin-dir", str(dirs["gpu-b"]), "--kube-api", api_server.url, "--replicas", "2",
                 "--node-poll-s", "0.05", "--verify-s", "60"],
                env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            agents: dict[str, tuple[NodeAgent, SlicePublisher]] = {}
            for n in ("gpu-a", "gpu-b"):
                src = SnapshotSource(cluster.source(n), node=n)
                agent = NodeAgent(AgentConfig(n), src, {}, clock=ManualClock())
                pub = SlicePublisher(
                    n,
                    device_snapshot=lambda s=src: s.last,
                    gateway=gw,
                    token=ADMIN,
                    kube=KubeApi.for_host(api_server.url),
                    mps_pipe_dirs=PIPES,
                )
                agent.observers.append(pub)
                agents[n] = (agent, pub)

            def publish_all() -> None:
                for agent, pub in agents.values():
                    agent.tick()
                    assert pub.flush() == []

            publish_all()
            # the control plane and the cluster both see what the agents discovered
            gw_ids = {st.slice.id for st in controller.allocator.states()}
            ann = {
                n: decode_slices(api_server.nodes[n]["metadata"]["annotations"][KEY], node=n) for n in agents
            }
            assert gw_ids == {s.id for ss in ann.values() for s in ss}
            migs = [s for s in ann["gpu-a"] if s.kind is SliceKind.MIG]
            truth = {d.uuid for g in cluster.read("gpu-a").gpus for d in g.mig_devices}
            assert migs and {s.uuid for s in migs} == truth
            assert {s.id for s in ann["gpu-b"]} == {"gpu-b/0/mps-pool", "gpu-b/1/mps-pool"}

            # the waiting device plugin subprocess registers once the annotation is there
            req_b = kubelets["gpu-b"].wait_registered(1, timeout_s=60)
            assert req_b.resource_name == "gpupool.io/gpu"

            # gpu-a: an in-process plugin with the pod feed and the node feed, as the CLI wires it
            cards = cards_of(ann["gpu-a"], "gpu-a")
            plugin = DevicePlugin(
                PluginConfig(node="gpu-a", plugin_dir=str(dirs["gpu-a"]), replicas=2, poll_s=0.05), cards
            ).start()
            for target, kw in (
                (plugin.run_pod_feed, {"watch_timeout_s": 1}),
                (plugin.run_node_feed, {"every_s": 0.05}),
            ):
                t = threading.Thread(target=target, args=(api, stop), kwargs=kw, daemon=True)
                t.start()
                threads.append(t)
            req_a = kubelets["gpu-a"].wait_registered(1)
            channel, stub = kubelets["gpu-a"].plugin(req_a.endpoint)
            stream = stub.ListAndWatch(pb.Empty(), timeout=60)
            first = next(stream)
            assert len(first.devices) == 8 and all(d.health == "Healthy" for d in first.devices)

            # the extender's inventory comes from the annotations only
            slices, skipped = slices_from_nodes(api.list_nodes())
            assert not skipped and {s.id for s in slices} == gw_ids
            pool = pool_of(slices, clock=ManualClock(1000.0))
            server = ExtenderServer(
                Extender(pool, api=api, wall_clock=iter(range(1000, 9000)).__next__)
            ).start()
            client = Client(server)
            pod = make_pod("llm", vram_mib=35000, compute_pct=40, gpus=1)
            api_server.add_pod(pod)
            out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
            assert out["NodeNames"] == ["gpu-a"], out
            m = pod["metadata"]
            bound = client.post(
                "bind",
                {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": "gpu-a"},
            )
            assert bound == {"Error": ""}
            wait_until(lambda: len(plugin.queue.waiting()) == 1, what="the bound pod queued on gpu-a")
            placed = plugin.queue.waiting()[0]
            (grant,) = placed.grants
            resp = stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=[f"{grant.gpu_id.replace('/', '_')}-0"])
                    ]
                ),
                timeout=10,
            )
            env = dict(resp.container_responses[0].envs)
            assert grant.kind is SliceKind.MIG  # best fit for 35000 MiB: a 3g/4g.40gb instance
            assert env["NVIDIA_VISIBLE_DEVICES"] == grant.uuid and grant.uuid in truth

            # an MPS pod on gpu-b: the subprocess plugin hands it the pipe dir the agent published
            guard = make_pod("guard", vram_mib=6000, compute_pct=20, gpus=1)
            api_server.add_pod(guard)
            assert client.post("filter", {"Pod": guard, "Nodes": None, "NodeNames": ["gpu-b"]})[
                "NodeNames"
            ] == ["gpu-b"]
            g = guard["metadata"]
            bind = {"PodName": g["name"], "PodNamespace": g["namespace"], "PodUID": g["uid"], "Node": "gpu-b"}
            assert client.post("bind", bind) == {"Error": ""}
            annotations = api_server.pod("default", "guard")["metadata"]["annotations"]
            (mps_grant,) = decode_placement(annotations[PLACEMENT]).grants
            assert mps_grant.kind is SliceKind.MPS
            channel_b, stub_b = kubelets["gpu-b"].plugin(req_b.endpoint)
            request = pb.AllocateRequest(
                container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[f"{mps_grant.gpu_id.replace('/', '_')}-0"])
                ]
            )
            got: list[dict[str, str]] = []

            def allocated() -> bool:
                try:
                    got.append(dict(stub_b.Allocate(request, timeout=10).container_responses[0].envs))
                except grpc.RpcError:
                    return False  # the plugin's pod feed has not seen the bind yet
                return True

            wait_until(allocated, what="Allocate on gpu-b")
            assert got[0]["CUDA_MPS_PIPE_DIRECTORY"] == PIPES[mps_grant.gpu_id]
            assert got[0]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6000M"
            channel_b.close()

            # GPU gpu-a/0 falls off the bus: one publish later every view has it unhealthy
            cluster.xid("gpu-a/0", 79)
            publish_all()
            sick = {st.slice.id for st in controller.allocator.states() if not st.healthy}
            assert sick and all(s.startswith("gpu-a/0/") for s in sick)
            again = decode_slices(api_server.nodes["gpu-a"]["metadata"]["annotations"][KEY], node="gpu-a")
            assert {s.id for s in again if not s.healthy} == sick
            report = sync_from_nodes(pool, api.list_nodes())
            assert set(report["health"]) == sick and not report["removed"]
            assert all(not pool.allocator.ledger.is_healthy(s) for s in sick)
            second = next(stream)
            assert {d.ID for d in second.devices if d.health == "Unhealthy"} == {"gpu-a_0-0", "gpu-a_0-1"}
            channel.close()
            client.close()
    finally:
        stop.set()
        if server is not None:
            server.stop()
        if plugin is not None:
            plugin.stop()
        if proc is not None:
            proc.terminate()
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
        for t in threads:
            t.join(timeout=5)
        for k in kubelets.values():
            k.stop()
        api_server.stop()
        store.close()
