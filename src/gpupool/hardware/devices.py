"""Device readings and the ``DeviceSource`` protocol that every device source implements.

Role: the common output of the NVML adapter (``gpupool.adapters.nvml``) and the simulated cluster
(``gpupool.adapters.simulated``): what the node agent polls every 200 ms and feeds to watermarks, and
what discovery turns into an ``Inventory``.

Public API:
- Values: ``ProcessReading``, ``MigDeviceReading``, ``GpuReading``, ``XidEvent``, ``DeviceSnapshot``.
- ``DeviceSource`` (Protocol): ``read() -> DeviceSnapshot`` and ``close()``.
- ``inventory_from_snapshot(snapshot)``: discovery -> ``Inventory`` (one MIG slice per MIG device with
  the memory NVML reported, one WHOLE slice per non-MIG GPU; unhealthy GPUs give unhealthy slices).
- ``reconcile_inventory(inventory, snapshots)``: a planned inventory with MIG uuids filled in from
  discovery and ``healthy`` cleared on slices whose GPU is lost or whose MIG device is missing.

Invariants:
- Memory is integer MiB; utilisation and temperature are integers or None when the device cannot say
  (NVML ``NOT_SUPPORTED``, e.g. utilisation on MIG-enabled GPUs). Power is integer milliwatts.
- A GPU that raised ``GpuIsLost`` is reported with ``healthy=False`` and a non-empty ``error``; it never
  disappears from the snapshot silently.
- Slice ids from discovery match planner ids (``<node>/<index>/mig-<profile>-<start>``,
  ``<node>/<index>/whole``) when the MIG placement start is known.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from gpupool.hardware.catalogue import gpu_model, model_from_nvml_name
from gpupool.hardware.inventory import Inventory
from gpupool.hardware.mig import MIG_FAMILIES
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU, Resources


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    used_mib: int
    gpu_instance_id: int = -1
    compute_instance_id: int = -1


@dataclass(frozen=True, slots=True)
class MigDeviceReading:
    uuid: str
    index: int
    """Index of the MIG device within its parent."""
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """Profile name derived from NVML data (``3g.40gb``)."""
    memory_total_mib: int
    memory_used_mib: int
    sm_count: int = 0
    sm_slices: int = 0
    start: int = -1
    """GPU-instance placement start slot; -1 when unknown."""
    engine_active_pct: int | None = None
    """Graphics/compute engine activity (DCGM GR_ENGINE_ACTIVE x 100); None when the source cannot say."""
    processes: tuple[ProcessReading, ...] = ()
    gi_profile_id: int = -1
    """NVML GPU-instance profile id (``nvmlGpuInstanceGetInfo().profileId``); -1 when unknown."""


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu_uuid: str
    xid: int
    gpu_instance_id: int = -1
    compute_instance_id: int = -1


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    model: str
    """Catalogue name when recognised, else empty."""
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    healthy: bool = True
    error: str = ""
    pci_bus_id: str = ""
    """NVML ``nvmlDeviceGetPciInfo().busId`` (``00000000:17:00.0``); empty when unknown."""
    memory_reserved_mib: int = 0
    """Driver/firmware reservation (NVML memory v2 ``reserved``), not counted in ``memory_used_mib``."""
    mig_pending: bool | None = None
    """MIG mode after the next reset (``nvmlDeviceGetMigMode()[1]``); None when unknown or unsupported."""

    @property
    def memory_used_pct(self) -> int:
        if self.memory_total_mib <= 0:
            return 0
        return self.memory_used_mib * 100 // self.memory_total_mib


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    node: str
    at_s: float
    gpus: tuple[GpuReading, ...]
    events: tuple[XidEvent, ...] = ()
    driver_version: str = ""
    source: str = ""
    """``nvml`` or ``simulated``."""
    cuda_driver_version: int = 0
    """``nvmlSystemGetCudaDriverVersion()`` (12020 = CUDA 12.2); 0 when unknown."""

    def gpu(self, index: int) -> GpuReading:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)


@runtime_checkable
class DeviceSource(Protocol):
    """Anything that reads the GPUs of one node (NVML, the simulated cluster, a replayed fixture)."""

    def read(self) -> DeviceSnapshot: ...

    def close(self) -> None: ...


_PROFILE_RE = re.compile(r"^(\d+)g\.")


def _sm_fraction_milli(g: GpuReading, d: MigDeviceReading) -> int:
    """SM-slice fraction x 1000 of a MIG device (slices from NVML, else from the profile name)."""
    m = _PROFILE_RE.match(d.profile)
    slices = d.sm_slices or (int(m.group(1)) if m else 0)
    known = gpu_model(g.model) if g.model else model_from_nvml_name(g.name, total_mib=g.memory_total_mib)
    family = MIG_FAMILIES.get(known.mig_family) if known is not None and known.mig_family else None
    total = family.sm_slices if family is not None else 7
    return min(COMPUTE_MILLI_PER_GPU, slices * COMPUTE_MILLI_PER_GPU // total)


def inventory_from_snapshot(snapshot: DeviceSnapshot) -> Inventory:
    """Discovery -> Inventory: a MIG slice per MIG device, a WHOLE slice per non-MIG GPU."""
    slices: list[Slice] = []
    node = snapshot.node
    for g in snapshot.gpus:
        gpu_id = f"{node}/{g.index}"
        if g.mig_enabled:
            for d in g.mig_devices:
                tag = d.start if d.start >= 0 else f"gi{d.gpu_instance_id}"
                slices.append(
                    Slice(
                        id=f"{gpu_id}/mig-{d.profile}-{tag}",
                        node=node,
                        gpu_id=gpu_id,
                        kind=SliceKind.MIG,
                        capacity=Resources(max(1, d.memory_total_mib), _sm_fraction_milli(g, d)),
                        healthy=g.healthy,
                        gpu_index=g.index,
                        gpu_model=g.model,
                        profile=d.profile,
                        uuid=d.uuid,
                    )
                )
            continue
        slices.append(
            Slice(
                id=f"{gpu_id}/whole",
                node=node,
                gpu_id=gpu_id,
                kind=SliceKind.WHOLE,
                capacity=Resources(max(1, g.memory_total_mib), COMPUTE_MILLI_PER_GPU),
                healthy=g.healthy,
                gpu_index=g.index,
                gpu_model=g.model,
                uuid=g.uuid,
            )
        )
    return Inventory(tuple(slices))


def reconcile_inventory(inventory: Inventory, snapshots: Iterable[DeviceSnapshot]) -> Inventory:
    """Fill MIG uuids / GPU uuids from discovery and mark slices of lost GPUs or missing MIG devices
    unhealthy. Slices on nodes without a snapshot are returned unchanged."""
    by_gpu: dict[str, GpuReading] = {}
    for snap in snapshots:
        for g in snap.gpus:
            by_gpu[f"{snap.node}/{g.index}"] = g
    out: list[Slice] = []
    for s in inventory:
        reading = by_gpu.get(s.gpu_id)
        if reading is None:
            out.append(s)
            continue
        g = reading
        healthy = s.healthy and g.healthy
        uuid = s.uuid
        if s.kind is SliceKind.MIG:
            start = _start_of(s.id)
            match = [d for d in g.mig_devices if d.profile == s.profile and (d.start == start or d.start < 0)]
            if match:
                uuid = match[0].uuid
            else:
                healthy = False
        elif not uuid:
            uuid = g.uuid
        out.append(replace(s, healthy=healthy, uuid=uuid))
    return Inventory(tuple(out))


def _start_of(slice_id: str) -> int:
    tail = slice_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
