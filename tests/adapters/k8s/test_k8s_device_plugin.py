"""The device plugin over real gRPC on unix sockets, driven by a fake kubelet."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet, FakePodResources
from tests.adapters.k8s.k8s_helpers import Client, pool_of, wait_until

from gpupool.adapters.k8s.annotations import PlacedGrant, Placement
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of, container_env
from gpupool.adapters.k8s.extender import Extender, ExtenderServer
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.core.clock import ManualClock
from gpupool.core.errors import InvalidInput
from gpupool.hardware.planner import inventory_from_cluster
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.spec import load_cluster_spec

CLUSTER = {
    "nodes": [
        {
            "name": "gpu-a",
            "gpus": [{"model": "L40S-48GB", "count": 2, "uuids": ["GPU-aaaa-0", "GPU-aaaa-1"]}],
        },
    ]
}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpdp", dir="/tmp"))  # unix socket paths must stay < 108 bytes
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


@pytest.fixture
def extender(fake_api: FakeApiServer) -> Iterator[tuple[list[Slice], Extender, Client]]:
    """The test cluster's slices, the extender over them behind its real HTTP server, and a client
    of it (closed and stopped after the test's own clean-up)."""
    slices = list(inventory_from_cluster(load_cluster_spec(CLUSTER)))
    ext = Extender(
        pool_of(slices, clock=ManualClock(0.0)),
        api=KubeApi.for_host(fake_api.url),
        wall_clock=iter(range(1000, 2000)).__next__,
    )
    server = ExtenderServer(ext).start()
    client = Client(server)
    yield slices, ext, client
    client.close()
    server.stop()


def _bind(client: Client, api: FakeApiServer, pod: dict[str, Any]) -> None:
    api.add_pod(pod)
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert out["NodeNames"] == ["gpu-a"], out
    m = pod["metadata"]
    assert client.post(
        "bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": "gpu-a"}
    ) == {"Error": ""}


def test_register_list_allocate_verify_and_reregister(
    short_dir: Path, fake_api: FakeApiServer, extender: tuple[list[Slice], Extender, Client]
) -> None:
    slices, _, client = extender
    kubelet = FakeKubelet(short_dir).start()
    podres = FakePodResources(short_dir / "pod-resources.sock")
    podres.server.start()
    cfg = PluginConfig(
        node="gpu-a",
        plugin_dir=str(short_dir),
        replicas=4,
        poll_s=0.05,
        pod_resources_socket=str(short_dir / "pod-resources.sock"),
    )
    plugin = DevicePlugin(cfg, cards_of(slices, "gpu-a")).start()
    stop = threading.Event()
    feeder = threading.Thread(
        target=plugin.run_pod_feed, args=(KubeApi.for_host(fake_api.url), stop), kwargs={"watch_timeout_s": 1}
    )
    feeder.start()
    try:
        req = kubelet.wait_registered(1)
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gpupool.sock", "gpupool.io/gpu")
        assert req.options.get_preferred_allocation_available
        channel, stub = kubelet.plugin(req.endpoint)
        opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        assert opts.get_preferred_allocation_available and not opts.pre_start_required
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        first = next(stream)
        ids = [d.ID for d in first.devices]
        assert len(ids) == 8 and all(d.health == "Healthy" for d in first.devices)
        assert ids[0] == "gpu-a_0-0"
        plugin.set_health("gpu-a/1", False)
        second = next(stream)
        assert {d.ID for d in second.devices if d.health == "Unhealthy"} == {f"gpu-a_1-{k}" for k in range(4)}
        plugin.set_health("gpu-a/1", True)
        next(stream)

        one = make_pod("one", vram_mib=30000, compute_pct=25, gpus=1)
        two = make_pod("two", vram_mib=30000, compute_pct=40, gpus=1)
        _bind(client, fake_api, one)
        wait_until(lambda: len(plugin.queue.waiting()) == 1, what="the bound pod queued on the node")
        card_one = next(iter(plugin.queue.waiting()[0].gpu_ids))

        pref = stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids, allocation_size=1)
                ]
            ),
            timeout=5,
        )
        chosen = list(pref.container_responses[0].deviceIDs)
        assert len(chosen) == 1 and plugin._ids[chosen[0]] == card_one

        resp = stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]),
            timeout=5,
        )
        env = dict(resp.container_responses[0].envs)
        placed_one = plugin.queue.taken()[0]
        assert env["GPUPOOL_POD"] == "default/one" and env["GPUPOOL_LEASE_ID"] == placed_one.lease_id
        assert env["NVIDIA_VISIBLE_DEVICES"] == ("GPU-aaaa-0" if card_one == "gpu-a/0" else "GPU-aaaa-1")
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30000M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert [(m.container_path, m.host_path) for m in resp.container_responses[0].mounts] == [
            ("/tmp/nvidia-mps", "/tmp/nvidia-mps")
        ]
        assert dict(resp.container_responses[0].annotations) == {
            "gpupool.io/lease": placed_one.lease_id,
            "gpupool.io/mps-host-ipc": "required",  # no --mps-shm-dir: the daemon uses the host's IPC
        }

        # kubelet admitted pod one; only now may pod two (same card count) bind on this node
        fake_api.admit("default", "one")
        _bind(client, fake_api, two)
        wait_until(lambda: len(plugin.queue.waiting()) == 1, what="pod two queued on the node")
        assert next(iter(plugin.queue.waiting()[0].gpu_ids)) != card_one

        # kubelet ignored the preference: the device is on pod one's card, the lease waiting is pod two's
        wrong = next(i for i in ids if plugin._ids[i] == card_one and i != chosen[0])
        resp2 = stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[wrong])]),
            timeout=5,
        )
        assert dict(resp2.container_responses[0].envs)["GPUPOOL_POD"] == "default/two"

        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[wrong])]),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no bound gpupool lease" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["x"])]),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        podres.pods = [
            ("default", "one", "gpupool.io/gpu", chosen),
            ("default", "two", "gpupool.io/gpu", [wrong]),
        ]
        drift = plugin.verify()
        assert len(drift) == 1 and "default/two" in drift[0]
        assert plugin.queue.taken() == []

        fake_api.update_pod("default", "one", phase="Running")
        channel.close()

        # kubelet restarts: it wipes the directory and comes back; the plugin must register again
        kubelet.stop(wipe=True)
        kubelet = FakeKubelet(short_dir).start()
        req2 = kubelet.wait_registered(1)
        assert req2.resource_name == "gpupool.io/gpu"
        wait_until(lambda: plugin.registrations >= 2, what="plugin counted its second registration")
        channel, stub = kubelet.plugin(req2.endpoint)
        assert len(next(stub.ListAndWatch(pb.Empty(), timeout=10)).devices) == 8
        channel.close()
    finally:
        stop.set()
        feeder.join(timeout=10)
        plugin.stop()
        kubelet.stop(wipe=False)
        podres.server.stop(grace=None)


def _placement(*grants: PlacedGrant) -> Placement:
    return Placement(
        lease_id="L",
        pod_uid="U",
        namespace="ns",
        name="p",
        container="c",
        node="n",
        priority=0,
        preemptible=False,
        vram_mib=grants[0].vram_mib,
        compute_milli=grants[0].compute_milli,
        gpu_count=len(grants),
        kinds=(),
        grants=grants,
        bound_at=1.0,
    )


def test_container_env_per_slice_kind() -> None:
    mig = PlacedGrant("n/0/mig", "n/0", "MIG-1234", SliceKind.MIG, 0, "3g.40gb", 40960, 428, False)
    env = container_env(_placement(mig), mps_pipe_dir="/run/mps")
    assert env.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-1234" and "CUDA_MPS_PIPE_DIRECTORY" not in env.envs
    assert env.mounts == ()
    with pytest.raises(InvalidInput, match="no device UUID"):
        container_env(
            _placement(PlacedGrant("n/0/mig", "n/0", "", SliceKind.MIG, 0, "1g", 1, 1, False)),
            mps_pipe_dir="/run/mps",
        )
    mps = PlacedGrant("n/1/mps0", "n/1", "GPU-b", SliceKind.MPS, 1, "", 4096, 0, False)
    env = container_env(_placement(mps), mps_pipe_dir="/run/mps")
    assert env.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env.envs
    w0 = PlacedGrant("n/2/whole", "n/2", "", SliceKind.WHOLE, 2, "", 81920, 1000, False)
    w1 = PlacedGrant("n/3/whole", "n/3", "", SliceKind.WHOLE, 3, "", 81920, 1000, False)
    env = container_env(_placement(w0, w1), mps_pipe_dir="/run/mps")
    assert env.envs["NVIDIA_VISIBLE_DEVICES"] == "2,3" and "CUDA_MPS_PIPE_DIRECTORY" not in env.envs


def _wide_placement() -> Placement:
    """A bound two-card lease on both cards of CLUSTER's node, waiting for its Allocate."""
    grants = tuple(
        PlacedGrant(
            f"gpu-a/{i}/whole", f"gpu-a/{i}", f"GPU-aaaa-{i}", SliceKind.WHOLE, i, "", 46068, 1000, False
        )
        for i in (0, 1)
    )
    return Placement(
        "lease-wide", "uid-wide", "default", "wide", "main", "gpu-a", 0, False, 46068, 1000, 2,
        (SliceKind.WHOLE,), grants, 1.0,
    )  # fmt: skip


def test_bad_device_ids_are_invalid_argument_and_take_no_lease(short_dir: Path) -> None:
    slices = list(inventory_from_cluster(load_cluster_spec(CLUSTER)))
    kubelet = FakeKubelet(short_dir).start()
    plugin = DevicePlugin(
        PluginConfig(node="gpu-a", plugin_dir=str(short_dir), replicas=2, poll_s=0.05),
        cards_of(slices, "gpu-a"),
    )
    plugin.start()
    try:
        channel, stub = kubelet.plugin(kubelet.wait_registered(1).endpoint)
        assert plugin.queue.offer(_wide_placement())

        def refused(call: Any, request: Any) -> str:
            with pytest.raises(grpc.RpcError) as err:
                call(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
            assert [p.name for p in plugin.queue.waiting()] == ["wide"]  # nothing taken
            return err.value.details() or ""

        def alloc(*requests: list[str]) -> pb.AllocateRequest:
            return pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
            )

        # the same ID twice counted as two cards: it took the two-card lease of other cards
        assert "repeat" in refused(stub.Allocate, alloc(["gpu-a_0-0", "gpu-a_0-0"]))
        assert "no device IDs" in refused(stub.Allocate, alloc([]))
        assert "not devices of gpu-a" in refused(stub.Allocate, alloc(["gpu-a_0-0", "gpu-a_1-0"], ["x"]))
        # a long unknown ID: the whole message exceeded gRPC's metadata limit (RESOURCE_EXHAUSTED)
        assert "not devices of gpu-a" in refused(stub.Allocate, alloc(["x" * 100_000]))

        def pref(available: list[str], size: int, must: list[str]) -> pb.PreferredAllocationRequest:
            creq = pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
            return pb.PreferredAllocationRequest(container_requests=[creq])

        ids = ["gpu-a_0-0", "gpu-a_0-1", "gpu-a_1-0", "gpu-a_1-1"]
        assert "not in available" in refused(stub.GetPreferredAllocation, pref(ids[:2], 2, ["bogus"]))
        assert "allocation_size" in refused(stub.GetPreferredAllocation, pref(ids, -1, []))
        got = stub.GetPreferredAllocation(pref(ids + ids, 2, []), timeout=5).container_responses[0]
        assert sorted(got.deviceIDs) == ["gpu-a_0-0", "gpu-a_1-0"]

        resp = stub.Allocate(alloc(["gpu-a_0-0", "gpu-a_1-0"]), timeout=5)
        assert dict(resp.container_responses[0].envs)["GPUPOOL_POD"] == "default/wide"
        channel.close()
    finally:
        plugin.stop()
        kubelet.stop()


def test_allocate_before_the_pod_watch_delivered_the_bound_pod(
    short_dir: Path, fake_api: FakeApiServer, extender: tuple[list[Slice], Extender, Client]
) -> None:
    """Kubelet and the plugin learn of a Binding through two watches; when kubelet's came first, its
    Allocate found no waiting placement and was refused, and kubelet does not retry a refused
    Allocate: the pod failed for good (UnexpectedAdmissionError). The plugin now lists the node's
    pods once before refusing. Here the pod watch never runs: only that list can find the pod."""
    slices, ext, client = extender
    kubelet = FakeKubelet(short_dir).start()
    plugin = DevicePlugin(
        PluginConfig(node="gpu-a", plugin_dir=str(short_dir), replicas=2, poll_s=0.05),
        cards_of(slices, "gpu-a"),
        api=KubeApi.for_host(fake_api.url),
    ).start()
    try:
        channel, stub = kubelet.plugin(kubelet.wait_registered(1).endpoint)
        pod = make_pod("early", vram_mib=20000, compute_pct=25, gpus=1)
        _bind(client, fake_api, pod)
        assert plugin.queue.waiting() == []
        resp = stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["gpu-a_0-0"])]),
            timeout=5,
        )
        env = dict(resp.container_responses[0].envs)
        assert env["GPUPOOL_POD"] == "default/early"
        assert env["GPUPOOL_LEASE_ID"] == ext.pool.lease_of(pod["metadata"]["uid"]).id
        with pytest.raises(grpc.RpcError) as err:  # nothing else is bound here: refused as before
            stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["gpu-a_1-0"])]
                ),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        channel.close()
    finally:
        plugin.stop()
        kubelet.stop()


def test_a_second_pod_of_the_same_card_count_binds_only_after_the_first_is_admitted(
    short_dir: Path, fake_api: FakeApiServer, extender: tuple[list[Slice], Extender, Client]
) -> None:
    """Allocate names devices, never the pod: with pods A (30000 MiB) and B (10000 MiB) both waiting
    on one card, kubelet admitting B first handed B's container A's lease and MPS limit. The
    extender now refuses B's bind while A waits, naming A; once A is admitted, B binds."""
    slices, ext, client = extender
    kubelet = FakeKubelet(short_dir).start()
    plugin = DevicePlugin(
        PluginConfig(node="gpu-a", plugin_dir=str(short_dir), replicas=4, poll_s=0.05),
        cards_of(slices, "gpu-a"),
        api=KubeApi.for_host(fake_api.url),
    ).start()

    def bind(pod: dict[str, Any]) -> dict[str, Any]:
        assert client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})["NodeNames"]
        m = pod["metadata"]
        args = {"PodName": m["name"], "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-a"}
        out: dict[str, Any] = client.post("bind", args)
        return out

    def allocate(card: str) -> dict[str, str]:
        creq = pb.ContainerAllocateRequest(devices_ids=[f"{card.replace('/', '_')}-0"])
        resp = stub.Allocate(pb.AllocateRequest(container_requests=[creq]), timeout=5)
        return dict(resp.container_responses[0].envs)

    try:
        channel, stub = kubelet.plugin(kubelet.wait_registered(1).endpoint)
        a = make_pod("a", vram_mib=30000, compute_pct=25, gpus=1)
        b = make_pod("b", vram_mib=10000, compute_pct=10, gpus=1)
        fake_api.add_pod(a)
        fake_api.add_pod(b)
        assert bind(a) == {"Error": ""}
        card_a = ext.pool.lease_of(a["metadata"]["uid"]).grants[0].gpu_id
        refused = bind(b)["Error"]
        assert "default/a" in refused and "bind default/b to gpu-a" in refused
        assert ext.pool.lease_of(b["metadata"]["uid"]) is None
        assert fake_api.pod("default", "b")["spec"].get("nodeName") is None

        env_a = allocate(card_a)
        assert env_a["GPUPOOL_POD"] == "default/a"
        assert env_a["GPUPOOL_LEASE_ID"] == ext.pool.lease_of(a["metadata"]["uid"]).id
        assert env_a["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30000M"
        fake_api.admit("default", "a")  # kubelet writes the status of the pod it admitted

        assert bind(b) == {"Error": ""}
        lease_b = ext.pool.lease_of(b["metadata"]["uid"])
        env_b = allocate(lease_b.grants[0].gpu_id)
        assert env_b["GPUPOOL_POD"] == "default/b" and env_b["GPUPOOL_LEASE_ID"] == lease_b.id
        assert env_b["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"
        channel.close()
    finally:
        plugin.stop()
        kubelet.stop()
