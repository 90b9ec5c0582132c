"""What the agent reads from a node each tick, and the port a device source implements.

Role: `DeviceSource` is the agent's view of NVML (or the simulated cluster). `ScriptedSource` is the
in-memory source the agent uses for ``--devices scripted`` and that tests push past watermarks; the
real NVML and simulated-cluster sources are adapted to this shape in `gpupool.agent.devices`.

Invariants:
- `GpuSample` values are integers in their named units (MiB, degC, percent, mW); None = unknown.
- ``error`` non-empty means the device could not be read (NVML error, GPU lost): the sample's other
  numbers are meaningless and the agent marks the GPU unhealthy.
- ``xids`` are the XID events seen since the previous `read` (each reported once).
- A source returns its GPUs in a stable order (by ``index`` then ``gpu_id``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpupool.core.errors import InvalidInput, UnknownId


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    pid: int
    used_mib: int


@dataclass(frozen=True, slots=True)
class GpuSample:
    gpu_id: str
    index: int
    vram_used_mib: int
    vram_total_mib: int
    uuid: str = ""
    model: str = ""
    temperature_c: int | None = None
    util_pct: int | None = None
    """Whole-GPU utilisation (NVML); None on MIG devices where NVML does not support it."""
    engine_active_ratio: float | None = None
    """Graphics/compute engine active ratio 0..1 (what DCGM reports per MIG instance)."""
    power_mw: int | None = None
    processes: tuple[ProcessUsage, ...] = ()
    mig_profile: str = ""
    gi_id: int | None = None
    error: str = ""
    xids: tuple[int, ...] = ()
    instances: tuple[GpuSample, ...] = ()
    """MIG instances of this GPU (for per-instance metrics); watermarks stay per physical GPU."""
    name: str = ""
    """NVML's device name (``NVIDIA H100 80GB HBM3``: dcgm-exporter's ``modelName``); empty if unknown."""
    pci_bus_id: str = ""
    """NVML PCI bus id of the physical GPU (MIG instances carry their parent's)."""


class DeviceSource(Protocol):
    def read(self) -> Sequence[GpuSample]:
        """One sample per GPU (or MIG device) of this node, in a stable order."""
        ...


@dataclass(slots=True)
class _Gpu:
    sample: GpuSample
    pending_xids: list[int] = field(default_factory=list)


class ScriptedSource:
    """An in-memory node whose readings are set by hand (tests, benchmarks, demos without NVML).

    Thread-safe: a test thread may `set` while the agent thread `read`\\ s.
    """

    def __init__(self, samples: Sequence[GpuSample]) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[str, _Gpu] = {}
        for s in sorted(samples, key=lambda s: (s.index, s.gpu_id)):
            if s.gpu_id in self._gpus:
                raise InvalidInput("gpu_id", s.gpu_id, "duplicate GPU in source")
            self._gpus[s.gpu_id] = _Gpu(s)

    @classmethod
    def uniform(
        cls, node: str, count: int, *, vram_total_mib: int = 81920, model: str = "H100-SXM5-80GB"
    ) -> ScriptedSource:
        return cls(
            [
                GpuSample(
                    f"{node}/{i}",
                    i,
                    0,
                    vram_total_mib,
                    uuid=f"GPU-{node}-{i:04d}",
                    model=model,
                    temperature_c=40,
                    util_pct=0,
                    power_mw=60_000,
                )
                for i in range(count)
            ]
        )

    def _get(self, gpu_id: str) -> _Gpu:
        g = self._gpus.get(gpu_id)
        if g is None:
            raise UnknownId("gpu", gpu_id)
        return g

    def set(self, gpu_id: str, **changes: object) -> GpuSample:
        """Replace fields of one GPU's sample (``vram_used_mib=...``, ``temperature_c=...``)."""
        with self._lock:
            g = self._get(gpu_id)
            g.sample = replace(g.sample, **changes)  # type: ignore[arg-type]
            return g.sample

    def set_used_ratio(self, gpu_id: str, ratio: float) -> GpuSample:
        with self._lock:
            g = self._get(gpu_id)
            g.sample = replace(g.sample, vram_used_mib=round(ratio * g.sample.vram_total_mib))
            return g.sample

    def inject_xid(self, gpu_id: str, xid: int) -> None:
        with self._lock:
            self._get(gpu_id).pending_xids.append(xid)

    def read(self) -> Sequence[GpuSample]:
        with self._lock:
            out = []
            for g in self._gpus.values():
                if g.pending_xids:
                    out.append(replace(g.sample, xids=tuple(g.pending_xids)))
                    g.pending_xids.clear()
                else:
                    out.append(g.sample)
            return out
