"""The node annotation's optional MPS pipe directories, and the device plugin following the agent's
published health over real gRPC (ListAndWatch) while the fake API server serves the node object."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_node
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet

from gpupool.adapters.k8s.annotations import decode_pipe_dirs, decode_slices, encode_slices
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of
from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

NODE = "gpu-a"


def card(i: int, *, healthy: bool = True, kind: SliceKind = SliceKind.WHOLE) -> Slice:
    suffix = "mps-pool" if kind is SliceKind.MPS else "whole"
    return Slice(
        f"{NODE}/{i}/{suffix}",
        NODE,
        f"{NODE}/{i}",
        kind,
        Resources(46068, 1000),
        healthy,
        i,
        "L40S-48GB",
        uuid=f"GPU-a-{i}",
    )


def test_pipe_dirs_ride_along_and_old_readers_ignore_them() -> None:
    slices = [card(0, kind=SliceKind.MPS), card(1)]
    text = encode_slices(slices, pipe_dirs={f"{NODE}/0/mps-pool": "/run/mps/0"})
    assert decode_slices(text, node=NODE) == slices
    assert decode_pipe_dirs(text) == {f"{NODE}/0/mps-pool": "/run/mps/0"}
    assert decode_pipe_dirs(encode_slices(slices)) == {}
    assert encode_slices(slices, pipe_dirs={}) == encode_slices(slices)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpdp", dir="/tmp"))  # unix socket paths must stay < 108 bytes
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def test_list_and_watch_follows_the_annotation(short_dir: Path, fake_api: FakeApiServer) -> None:
    fake_api.add_node(make_node(NODE, {"gpupool.io/slices": encode_slices([card(0), card(1)])}))
    api = KubeApi.for_host(fake_api.url)
    kubelet = FakeKubelet(short_dir).start()
    plugin = DevicePlugin(
        PluginConfig(node=NODE, plugin_dir=str(short_dir), replicas=2, poll_s=0.05),
        cards_of([card(0), card(1)], NODE),
    ).start()
    stop = threading.Event()
    feeder = threading.Thread(target=plugin.run_node_feed, args=(api, stop), kwargs={"every_s": 0.05})
    feeder.start()
    try:
        channel, stub = kubelet.plugin(kubelet.wait_registered(1).endpoint)
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert all(d.health == "Healthy" for d in next(stream).devices)
        api.annotate_node(NODE, {"gpupool.io/slices": encode_slices([card(0), card(1, healthy=False)])})
        second = next(stream)
        assert {d.ID for d in second.devices if d.health == "Unhealthy"} == {"gpu-a_1-0", "gpu-a_1-1"}
        # card 0 vanishes from the agent's list and a new card 2 appears
        api.annotate_node(NODE, {"gpupool.io/slices": encode_slices([card(1, healthy=False), card(2)])})
        third = next(stream)
        health = {d.ID: d.health for d in third.devices}
        assert health["gpu-a_0-0"] == "Unhealthy" and health["gpu-a_2-1"] == "Healthy"
        assert len(health) == 6
        channel.close()
    finally:
        stop.set()
        feeder.join(timeout=5)
        plugin.stop()
        kubelet.stop()


def test_follow_reports_only_changes() -> None:
    plugin = DevicePlugin(PluginConfig(node=NODE, replicas=1), cards_of([card(0)], NODE))
    assert plugin.follow([card(0)]) == []
    assert plugin.follow([card(0, healthy=False)]) == [f"{NODE}/0"]
    assert plugin.device_list() == [("gpu-a_0-0", "Unhealthy")]


def test_allocate_uses_the_pipe_dir_the_agent_published(fake_api: FakeApiServer) -> None:
    from gpupool.adapters.k8s.annotations import PlacedGrant, Placement

    mps = card(0, kind=SliceKind.MPS)
    text = encode_slices([mps, card(1)], pipe_dirs={mps.id: "/run/mps/0"})
    fake_api.add_node(make_node(NODE, {"gpupool.io/slices": text}))
    plugin = DevicePlugin(PluginConfig(node=NODE, replicas=1), cards_of([mps, card(1)], NODE))
    grant = PlacedGrant(mps.id, mps.gpu_id, mps.uuid, SliceKind.MPS, 0, "", 4096, 100, True)
    placed = Placement(
        "l1", "uid", "default", "p", "main", NODE, -1, True, 4096, 100, 1, (SliceKind.MPS,), (grant,), 1.0
    )
    assert plugin.pipe_dir_of(placed) == "/tmp/nvidia-mps"  # nothing read yet: the flag's default
    plugin.read_node_once(KubeApi.for_host(fake_api.url), "gpupool.io/slices")
    assert plugin.pipe_dir_of(placed) == "/run/mps/0"
