"""The container side of a bound placement: what kubelet's Allocate hands the container.

Role: a pure function of a `Placement` (no I/O): ``NVIDIA_VISIBLE_DEVICES`` (GPU or MIG UUIDs, card
indices for whole cards without a UUID), the ``GPUPOOL_*`` variables, and for MPS or shared-card
grants the MPS client side built per grant by an injected `MpsSide` (the CLI passes
``gpupool.adapters.mps.container_mps``; `plain_mps_side` gives the same shape without it). Used by
the device plugin (`gpupool.adapters.k8s.device_plugin`).

Invariants: a MIG grant without a device UUID, or MPS grants of one container on daemons with
different pipe directories (a client talks to one daemon), are `InvalidInput`, never a partial env.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpupool.adapters.k8s.annotations import Placement
from gpupool.adapters.k8s.resources import DEFAULT_NAMES
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import SliceKind


@dataclass(frozen=True, slots=True)
class ContainerEnv:
    envs: dict[str, str]
    mounts: tuple[tuple[str, str, bool], ...]
    """(container path, host path, read only)."""
    annotations: dict[str, str]
    host_ipc: bool = False
    """The MPS daemon shares the host's IPC namespace: the pod must set ``hostIPC: true``."""


class MpsClientSide(Protocol):
    """What a container needs to be a client of one MPS daemon (`gpupool.adapters.mps.ContainerMps`)."""

    @property
    def env(self) -> dict[str, str]: ...

    @property
    def mounts(self) -> tuple[tuple[str, str], ...]:
        """(host path, container path), read-write."""
        ...

    @property
    def host_ipc(self) -> bool: ...


MpsSide = Callable[..., MpsClientSide]
"""``(pipe_directory, device, *, vram_mib, compute_milli, shm_directory) -> MpsClientSide``."""


@dataclass(frozen=True, slots=True)
class _PlainMps:
    env: dict[str, str]
    mounts: tuple[tuple[str, str], ...]
    host_ipc: bool


def plain_mps_side(
    pipe_directory: str, device: int | str, *, vram_mib: int, compute_milli: int, shm_directory: str = ""
) -> MpsClientSide:
    """The container side of one MPS grant without the MPS adapter (same shape as ``container_mps``)."""
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": pipe_directory,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device}={vram_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(min(100, max(1, -(-compute_milli // 10)))),
    }
    mounts = [(pipe_directory, pipe_directory)]
    if shm_directory:
        mounts.append((shm_directory, "/dev/shm"))  # noqa: S108 - the container's shm mount point
    return _PlainMps(env, tuple(mounts), not shm_directory)


def container_env(
    p: Placement,
    *,
    mps_pipe_dir: str,
    domain: str = DEFAULT_NAMES.domain,
    pipe_dirs: Mapping[str, str] | None = None,
    shm_dir: str = "",
    mps: MpsSide = plain_mps_side,
) -> ContainerEnv:
    """The container side of a lease. MPS (and shared whole-card) grants get ``mps``'s client side,
    each on its own container ordinal with its slice's pipe directory (``pipe_dirs``, else
    ``mps_pipe_dir``). Raises `InvalidInput` when a MIG grant has no device UUID or the MPS grants
    name different pipe directories."""
    visible = []
    for g in p.grants:
        if g.uuid:
            visible.append(g.uuid)
        elif g.kind is SliceKind.MIG:
            raise InvalidInput("placement.grants.uuid", g.slice_id, "MIG slice has no device UUID yet")
        else:
            visible.append(str(g.index))
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(visible),
        "GPUPOOL_LEASE_ID": p.lease_id,
        "GPUPOOL_POD": f"{p.namespace}/{p.name}",
        "GPUPOOL_VRAM_MIB": str(p.vram_mib),
        "GPUPOOL_COMPUTE_MILLI": str(p.compute_milli),
    }
    annotations = {f"{domain}/lease": p.lease_id}
    sides = [
        (ordinal, g, (pipe_dirs or {}).get(g.slice_id, mps_pipe_dir))
        for ordinal, g in enumerate(p.grants)
        if g.kind is SliceKind.MPS or (g.shared and g.kind is not SliceKind.MIG)
    ]
    if not sides:
        return ContainerEnv(envs, (), annotations)
    pipes = sorted({pipe for _, _, pipe in sides})
    if len(pipes) > 1:
        raise InvalidInput(
            "placement.grants",
            [g.slice_id for _, g, _ in sides],
            f"MPS grants on daemons {pipes}: one per container",
        )
    limits, percents, host_ipc = [], [], False
    mounts: dict[str, tuple[str, str, bool]] = {}
    for ordinal, g, pipe in sides:
        side = mps(pipe, ordinal, vram_mib=g.vram_mib, compute_milli=g.compute_milli, shm_directory=shm_dir)
        limits.append(side.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
        if g.compute_milli > 0:
            percents.append(int(side.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]))
        envs["CUDA_MPS_PIPE_DIRECTORY"] = side.env["CUDA_MPS_PIPE_DIRECTORY"]
        for host, ctr in side.mounts:
            mounts[ctr] = (ctr, host, False)
        host_ipc = host_ipc or side.host_ipc
    envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    if percents:
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(percents))
    if host_ipc:
        annotations[f"{domain}/mps-host-ipc"] = "required"
    return ContainerEnv(envs, tuple(mounts.values()), annotations, host_ipc)
