"""Allocate hands an MPS container what NVIDIA's MPS support gives it (pipe directory and the daemon's
``/dev/shm`` mounted, per-client ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` / ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
host IPC flagged when the daemon has no shm directory of its own), built by the MPS adapter's
``container_mps`` as the CLI wires it, over real gRPC on unix sockets from a fake kubelet."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.adapters.k8s.k8s_fakekubelet import FakeKubelet

from gpupool.adapters.k8s.annotations import PlacedGrant, Placement
from gpupool.adapters.k8s.device_plugin import DevicePlugin, PluginConfig, cards_of, container_env
from gpupool.adapters.k8s.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.cli.device_plugin import mps_client_side
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

NODE = "gpu-m"
PIPES = {f"{NODE}/0/mps-pool": "/run/gpupool/mps/0", f"{NODE}/1/mps-pool": "/run/gpupool/mps/1"}
SHM = "/run/gpupool/mps-shm"


def mps_slice(i: int) -> Slice:
    return Slice(
        f"{NODE}/{i}/mps-pool", NODE, f"{NODE}/{i}", SliceKind.MPS, Resources(46068, 1000), True, i,
        "L40S-48GB", uuid=f"GPU-m-{i}",
    )  # fmt: skip


def placement(name: str, *grants: tuple[int, int, int]) -> Placement:
    """``grants``: (card, vram_mib, compute_milli) per MPS grant."""
    gs = tuple(
        PlacedGrant(f"{NODE}/{i}/mps-pool", f"{NODE}/{i}", f"GPU-m-{i}", SliceKind.MPS, i, "", v, c, True)
        for i, v, c in grants
    )
    return Placement(
        f"lease-{name}", f"uid-{name}", "default", name, "main", NODE, 0, False,
        sum(v for _, v, _ in grants), max(c for _, _, c in grants), len(gs), (SliceKind.MPS,), gs, 1.0,
    )  # fmt: skip


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="gpmp", dir="/tmp"))  # unix socket paths must stay < 108 bytes
    yield d
    for f in d.iterdir():
        f.unlink()
    d.rmdir()


def _allocate(stub: object, *ids: str) -> pb.AllocateResponse:
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])
    return stub.Allocate(request, timeout=10)  # type: ignore[attr-defined]


def test_allocate_gives_an_mps_client_its_daemon_limits_and_shm(short_dir: Path) -> None:
    slices = [mps_slice(0), mps_slice(1)]
    kubelet = FakeKubelet(short_dir).start()
    plugin = DevicePlugin(
        PluginConfig(node=NODE, plugin_dir=str(short_dir), replicas=2, poll_s=0.05, mps_shm_dir=SHM),
        cards_of(slices, NODE),
        mps=mps_client_side,
    )
    plugin.pipe_dirs = dict(PIPES)  # as read from the agent's node annotation
    plugin.start()
    try:
        channel, stub = kubelet.plugin(kubelet.wait_registered(1).endpoint)
        assert plugin.queue.offer(placement("guard", (1, 6000, 200)))
        resp = _allocate(stub, "gpu-m_1-0").container_responses[0]
        env = dict(resp.envs)
        assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-m-1"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpupool/mps/1"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6000M"  # ordinal as the container sees it
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
        mounts = {(m.container_path, m.host_path, m.read_only) for m in resp.mounts}
        assert mounts == {("/run/gpupool/mps/1", "/run/gpupool/mps/1", False), ("/dev/shm", SHM, False)}
        assert dict(resp.annotations) == {"gpupool.io/lease": "lease-guard"}

        # a grant without a compute reservation gets no thread cap, only its memory cap
        assert plugin.queue.offer(placement("embed", (0, 4096, 0)))
        env = dict(_allocate(stub, "gpu-m_0-0").container_responses[0].envs)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env

        # two cards on two daemons: an MPS client talks to one daemon, so Allocate refuses, lease kept
        assert plugin.queue.offer(placement("wide", (0, 2048, 100), (1, 2048, 100)))
        with pytest.raises(grpc.RpcError) as err:
            _allocate(stub, "gpu-m_0-1", "gpu-m_1-1")
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "one per container" in (err.value.details() or "")
        assert [p.name for p in plugin.queue.waiting()] == ["wide"]
        channel.close()
    finally:
        plugin.stop()
        kubelet.stop()


def test_without_a_shm_directory_the_pod_is_told_it_needs_host_ipc() -> None:
    p = placement("guard", (0, 6000, 200))
    env = container_env(p, mps_pipe_dir="/tmp/nvidia-mps", pipe_dirs=PIPES, mps=mps_client_side)
    assert env.host_ipc and env.annotations["gpupool.io/mps-host-ipc"] == "required"
    assert env.mounts == (("/run/gpupool/mps/0", "/run/gpupool/mps/0", False),)
    # one container on two cards of the same daemon: one pipe directory, a memory cap per ordinal
    same = {f"{NODE}/0/mps-pool": "/run/mps", f"{NODE}/1/mps-pool": "/run/mps"}
    wide = placement("wide", (0, 2048, 100), (1, 3072, 300))
    env = container_env(wide, mps_pipe_dir="/x", pipe_dirs=same, shm_dir=SHM, mps=mps_client_side)
    assert env.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M,1=3072M"
    assert env.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and not env.host_ipc
    # a grant the MPS adapter refuses (no memory) is a clear error naming the field
    with pytest.raises(InvalidInput, match="pinned_mem_limit_mib"):
        container_env(placement("z", (0, 0, 100)), mps_pipe_dir="/x", mps=mps_client_side)
