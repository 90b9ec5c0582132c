"""The node loop end to end, without a cluster: the fake Kubernetes API server, two simulated nodes
(the seed's A100 MIG node gpu-a and L40S MPS node gpu-b, real processes holding simulated VRAM
through the VRAM registry), on each a real node agent publishing its discovery and a real device
plugin registered with a fake kubelet over gRPC on unix sockets, the control plane (the gateway the
agents publish to, the extender reading the node annotations, its pod reconciler and preemptor), and
a driver that calls the extender as kube-scheduler's HTTPExtender does (filter -> prioritize ->
bind, retrying). The fake kubelet starts a container (a holder process on the granted slice) after
Allocate and kills it when its pod is deleted or evicted.

Then: pods of the seed's four workload types (guardrail, embedding, 14B-70B reasoning, batch) get
devices and MPS env; a P0 pod preempts a P2 pod whose process really exits and frees its simulated
VRAM; a GPU fails and its pods are reported; a MIG re-partition of the reasoning pod's GPU
(`NvmlMigActuator` on the simulated NVML, as ``plan --apply --actuator simulated``) is refused until
that pod is drained, then applies and every view follows. Waits are liveness bounds, not timings."""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpupool.adapters.http.app import create_app
from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.k8s.annotations import decode_placement, decode_slices
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.inventory import slices_from_nodes, sync_from_nodes
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.preemptor import Preemptor
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.adapters.k8s.reconciler import PodReconciler
from gpupool.adapters.simulated import SimulatedCluster
from gpupool.adapters.simulated.defaults import DEFAULT_CLUSTER, DEFAULT_WORKLOADS
from gpupool.adapters.simulated.holder import start_holder
from gpupool.adapters.store import SqliteLeaseStore
from gpupool.agent.devices import SnapshotSource
from gpupool.agent.loop import AgentConfig, NodeAgent
from gpupool.agent.publish import SlicePublisher
from gpupool.cli.device_plugin import mps_client_side
from gpupool.core.clock import FunctionClock, ManualClock
from gpupool.core.controller import LeaseController
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migactuate import NvmlMigActuator
from gpupool.hardware.planner import plan as make_plan
from gpupool.hardware.slices import SliceKind
from gpupool.hardware.spec import load_cluster_spec, load_workload_spec
from tests.adapters.http.servers import running
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node, make_pod
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet
from tests.adapters.k8s.k8s_helpers import Client, pool_of, wait_until

ADMIN = "agent-admin-token-01"
KEY = "gpupool.io/slices"
NODES = ("gpu-a", "gpu-b")
PIPES = {"gpu-b/0": "/run/gpupool/mps/0", "gpu-b/1": "/run/gpupool/mps/1"}
SHM = "/run/gpupool/mps-shm"


@pytest.fixture
def dirs() -> Iterator[dict[str, Path]]:
    made = {n: Path(tempfile.mkdtemp(prefix=f"gpl{n[-1]}", dir="/tmp")) for n in NODES}  # short socket paths
    yield made
    for d in made.values():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()


class Kubelet:
    """The container side of the fake kubelets: Allocate, then run the container (a holder process
    on its slice); delete or evict the pod and its container is killed."""

    def __init__(self, api_server: FakeApiServer, stubs: dict[str, Any], registry: Path) -> None:
        self.api_server, self.stubs, self.registry = api_server, stubs, registry
        self.containers: dict[str, subprocess.Popen[str]] = {}
        self.used: dict[str, int] = {}

    def allocate(self, node: str, name: str) -> tuple[dict[str, str], Any]:
        ann = self.api_server.pod("default", name)["metadata"]["annotations"]
        p = decode_placement(ann["gpupool.io/placement"])
        ids = []
        for g in p.grants:
            k = self.used.get(g.gpu_id, 0)
            self.used[g.gpu_id] = k + 1
            ids.append(f"{g.gpu_id.replace('/', '_')}-{k}")
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        got: list[Any] = []

        def allocated() -> bool:
            try:
                got.append(self.stubs[node].Allocate(request, timeout=10).container_responses[0])
            except Exception:  # the plugin's pod feed has not seen the bind yet
                return False
            return True

        wait_until(allocated, timeout_s=20, what=f"Allocate of {name} on {node}")
        self.api_server.admit("default", name)  # kubelet writes the admitted pod's status
        (g,) = p.grants
        target = g.slice_id if g.kind is SliceKind.MIG else g.gpu_id
        proc, _ = start_holder(self.registry, target, p.vram_mib)
        self.containers[name] = proc
        return dict(got[0].envs), p

    def kill_gone(self) -> list[str]:
        """Kill the containers of pods no longer in the API (deleted or evicted); their names."""
        gone = [n for n in self.containers if ("default", n) not in self.api_server.pods]
        for n in gone:
            proc = self.containers.pop(n)
            proc.terminate()
            assert proc.wait(10) == 0  # the holder exits on SIGTERM, releasing its memory
        return gone

    def stop(self) -> None:
        for proc in self.containers.values():
            proc.kill()
            proc.wait()


def schedule(client: Client, pod: dict[str, Any], *, tries: int = 3) -> str | None:
    """kube-scheduler's HTTPExtender: filter, prioritize the survivors, bind the best; a bind
    error is retried. None: unschedulable now (the scheduler would retry later)."""
    m = pod["metadata"]
    for _ in range(tries):
        out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": list(NODES)})
        names = out.get("NodeNames") or []
        if not names:
            return None
        scores = client.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})
        best = max(scores, key=lambda h: (h["Score"], h["Host"]))["Host"]
        bound = client.post(
            "bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": best}
        )
        if bound == {"Error": ""}:
            return str(best)
    return None


def test_the_node_loop_end_to_end(dirs: dict[str, Path], tmp_path: Path) -> None:
    spec = load_cluster_spec(DEFAULT_CLUSTER, source="embedded-default-cluster")
    layout = make_plan(spec, load_workload_spec(DEFAULT_WORKLOADS, source="embedded-default-workloads"))
    registry = tmp_path / "vram"
    sim = SimulatedCluster(spec, replace(layout, placements=()), vram_registry=registry)  # pods are the load
    api_server = FakeApiServer().start()
    for n in NODES:
        api_server.add_node(make_node(n))
    api = KubeApi.for_host(api_server.url)
    store = SqliteLeaseStore(tmp_path / "leases.db")
    controller = LeaseController([], clock=FunctionClock(time.time), store=store)
    kubelets = {n: FakeKubelet(d).start() for n, d in dirs.items()}
    stop = threading.Event()
    threads: list[threading.Thread] = []
    plugins: list[DevicePlugin] = []
    server: ExtenderServer | None = None
    kube: Kubelet | None = None
    try:
        with running(create_app(controller, tokens=TokenTable([(ADMIN, "ops", "admin")]), tick_s=0.05)) as gw:
            agents: dict[str, tuple[NodeAgent, SlicePublisher]] = {}
            for n in NODES:
                src = SnapshotSource(sim.source(n), node=n)
                agent = NodeAgent(AgentConfig(n), src, {}, clock=ManualClock())
                pub = SlicePublisher(
                    n, device_snapshot=lambda s=src: s.last, gateway=gw, token=ADMIN,
                    kube=KubeApi.for_host(api_server.url), mps_pipe_dirs=PIPES,
                )  # fmt: skip
                agent.observers.append(pub)
                agents[n] = (agent, pub)

            def publish_all() -> None:
                for agent, pub in agents.values():
                    agent.tick()
                    assert pub.flush() == []

            publish_all()
            ann = {
                n: decode_slices(api_server.nodes[n]["metadata"]["annotations"][KEY], node=n) for n in NODES
            }
            assert {st.slice.id for st in controller.allocator.states()} == {
                s.id for ss in ann.values() for s in ss
            }

            stubs: dict[str, Any] = {}
            for n in NODES:
                plugin = DevicePlugin(
                    PluginConfig(node=n, plugin_dir=str(dirs[n]), replicas=4, poll_s=0.05, mps_shm_dir=SHM),
                    cards_of(ann[n], n),
                    mps=mps_client_side,
                )
                plugin.read_node_once(api, KEY)  # as `gpupool device-plugin` does before it registers
                plugin.start()
                plugins.append(plugin)
                for target, kw in (
                    (plugin.run_pod_feed, {"watch_timeout_s": 1}),
                    (plugin.run_node_feed, {"every_s": 0.05}),
                ):
                    threads.append(threading.Thread(target=target, args=(api, stop), kwargs=kw, daemon=True))
                _, stubs[n] = kubelets[n].plugin(kubelets[n].wait_registered(1).endpoint)

            slices, skipped = slices_from_nodes(api.list_nodes())
            assert not skipped
            pool = pool_of(slices, clock=ManualClock(1000.0))
            reconciler = PodReconciler(pool)
            threads.append(
                threading.Thread(
                    target=reconciler.run, args=(api, stop), kwargs={"watch_timeout_s": 1}, daemon=True
                )
            )
            for t in threads:
                t.start()
            server = ExtenderServer(
                Extender(pool, api=api, wall_clock=iter(range(1000, 9000)).__next__)
            ).start()
            client = Client(server)
            kube = Kubelet(api_server, stubs, registry)

            def submit(name: str, **kw: Any) -> dict[str, Any]:
                kind = kw.pop("kind", "")
                pod = make_pod(name, annotations={"gpupool.io/slice-kind": kind} if kind else None, **kw)
                api_server.add_pod(pod)
                return pod

            # the seed's four workload types
            placed: dict[str, tuple[str, dict[str, str], Any]] = {}
            workloads = (  # name, vram MiB, compute %, PriorityClass, slice kind
                ("guardrail", 6000, 20, "gpupool-p0", "mps"),
                ("embedding", 4000, 10, "gpupool-p1", "mps"),
                ("reasoning", 35000, 40, "gpupool-p0", "mig"),
                ("batch-1", 70000, None, "gpupool-p2", "whole"),
                ("batch-2", 70000, None, "gpupool-p2", "whole"),
            )
            for name, mib, pct, prio, kind in workloads:
                pod = submit(name, vram_mib=mib, compute_pct=pct, gpus=1, priority_class=prio, kind=kind)
                node = schedule(client, pod)
                assert node is not None, name
                env, p = kube.allocate(node, name)
                placed[name] = (node, env, p)
            for name in ("guardrail", "embedding"):
                node, env, p = placed[name]
                (g,) = p.grants
                assert node == "gpu-b" and g.kind is SliceKind.MPS
                assert env["CUDA_MPS_PIPE_DIRECTORY"] == PIPES[g.gpu_id]
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={p.vram_mib}M"
                assert env["NVIDIA_VISIBLE_DEVICES"] == g.uuid
            assert placed["guardrail"][1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
            node, env, p = placed["reasoning"]
            (reason_grant,) = p.grants
            assert node == "gpu-a" and reason_grant.kind is SliceKind.MIG
            assert env["NVIDIA_VISIBLE_DEVICES"] == reason_grant.uuid and "CUDA_MPS_PIPE_DIRECTORY" not in env
            whole = {placed[b][2].grants[0].gpu_id for b in ("batch-1", "batch-2")}
            assert whole == {"gpu-a/2", "gpu-a/3"}
            agents["gpu-a"][0].tick()
            used = {g.index: g.memory_used_mib for g in sim.read("gpu-a").gpus}
            assert used[2] == used[3] == 70000  # the containers' processes really hold the memory

            # a P0 that fits nowhere: the preemptor evicts a P2, its container exits, the P0 lands
            main = submit("main-llm", vram_mib=70000, gpus=1, priority_class="gpupool-p0", kind="whole")
            assert schedule(client, main) is None
            (ev,) = Preemptor(pool).run_once(api)
            ((_, _, victim),) = ev.victims
            assert victim.startswith("batch-") and ("default", victim) in api_server.evictions
            assert kube.kill_gone() == [victim]
            freed = placed[victim][2].grants[0]
            assert sim.read("gpu-a").gpu(int(freed.gpu_id.split("/")[1])).memory_used_mib == 0
            wait_until(
                lambda: pool.lease_of(placed[victim][2].pod_uid) is None, what="the victim's lease released"
            )
            assert schedule(client, main) == "gpu-a"
            _, p0 = kube.allocate("gpu-a", "main-llm")
            assert p0.grants[0].gpu_id == freed.gpu_id

            # a GPU fails: every view has it unhealthy and its pods are reported
            sick_gpu = placed["guardrail"][2].grants[0].gpu_id
            sim.xid(sick_gpu, 79)
            publish_all()
            report = sync_from_nodes(pool, api.list_nodes())
            assert report["health"] == [f"{sick_gpu}/mps-pool"]
            on_sick = sorted(
                name for name, (_, _, pl) in placed.items()
                if (lease := pool.lease_of(pl.pod_uid)) is not None
                and any(not pool.allocator.ledger.is_healthy(s) for s in pool.slices_of(lease))
            )  # fmt: skip
            want = sorted(n for n in ("guardrail", "embedding") if placed[n][2].grants[0].gpu_id == sick_gpu)
            assert on_sick == want and "guardrail" in on_sick

            # re-partition the reasoning pod's GPU: refused while its pod holds the instance, then applied
            gpu_index = int(reason_grant.gpu_id.split("/")[1])
            act = NvmlMigActuator(
                sim.mig_hardware("gpu-a"),
                busy=lambda node, index, doomed: [
                    lease.id for uid in pool.pod_uids() if (lease := pool.lease_of(uid)) is not None
                    for sid in pool.slices_of(lease)
                    if any(sid == f"{node}/{index}/mig-{d.profile}-{d.start}" for d in doomed)
                ],
            )  # fmt: skip
            current = act.current(gpu_index)
            doomed = next(i for i in current if f"mig-{i.profile}-{i.start}" in reason_grant.slice_id)
            new = (MigInstance("2g.20gb", doomed.start), MigInstance("1g.10gb", doomed.start + 2))
            wanted = {gpu_index: tuple(sorted([*(i for i in current if i != doomed), *new]))}
            first = act.apply("gpu-a", wanted)
            assert not first.ok and first.busy == (p.lease_id,) and "drain first" in first.detail
            assert act.current(gpu_index) == current  # nothing changed on the hardware
            api_server.delete_pod("default", "reasoning")  # the drain: its pod goes
            assert kube.kill_gone() == ["reasoning"]
            wait_until(lambda: pool.lease_of(p.pod_uid) is None, what="the reasoning lease released")
            second = act.apply("gpu-a", wanted)
            assert second.ok, second.detail
            publish_all()
            report = sync_from_nodes(pool, api.list_nodes())
            want_ids = {f"gpu-a/{gpu_index}/mig-{i.profile}-{i.start}" for i in new}
            assert want_ids <= set(pool.slices()) and reason_grant.slice_id not in pool.slices()
            assert reason_grant.slice_id in report["removed"]
            assert want_ids <= {st.slice.id for st in controller.allocator.states()}
            client.close()
    finally:
        stop.set()
        if kube is not None:
            kube.stop()
        if server is not None:
            server.stop()
        for plugin in plugins:
            plugin.stop()
        for t in threads:
            t.join(timeout=5)
        for k in kubelets.values():
            k.stop()
        api_server.stop()
        store.close()
