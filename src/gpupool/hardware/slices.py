"""`Slice` and `SliceKind`: the unit the allocator hands out.

Role: a slice is an isolated share of one physical GPU (a MIG instance, an MPS share, a time-sliced
share, or the whole card) with a fixed capacity in VRAM MiB x compute milli-GPU.

Invariants:
- A slice belongs to exactly one physical GPU (``gpu_id``) on exactly one node; the allocator never
  splits a request across slices, so a request never spans physical GPUs.
- ``capacity`` is strictly positive in VRAM and non-negative in compute.
- Slices are values (frozen). Health changes go through the ledger, which owns mutable state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.hardware.units import Resources, check_ints


class SliceKind(StrEnum):
    """How a slice is isolated, strongest first.

    - ``MIG``: hardware partition, own memory controllers, SMs and fault domain.
    - ``MPS``: software VRAM cap (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and thread percentage; a fatal
      fault in one client resets every client of that GPU.
    - ``WHOLE``: an entire card, shared only by leases the allocator grants on it.
    - ``TIME_SLICE``: no memory isolation at all; last resort for development.
    """

    MIG = "mig"
    MPS = "mps"
    WHOLE = "whole"
    TIME_SLICE = "time-slice"


@dataclass(frozen=True, slots=True)
class Slice:
    """One leasable share of one physical GPU."""

    id: str
    node: str
    gpu_id: str
    kind: SliceKind
    capacity: Resources
    healthy: bool = True
    gpu_index: int = 0
    gpu_model: str = ""
    profile: str = ""
    """MIG profile name (``3g.40gb``) or MPS share label; empty for whole cards."""
    uuid: str = ""
    """NVML UUID of the GPU or MIG device when known (``GPU-...`` / ``MIG-...``)."""
    labels: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("Slice.id must be a non-empty string")
        if not self.node:
            raise ValueError(f"Slice {self.id}: node must be a non-empty string")
        if not self.gpu_id:
            raise ValueError(f"Slice {self.id}: gpu_id must be a non-empty string")
        check_ints(self.capacity, field=f"Slice {self.id}: capacity")
        if self.capacity.vram_mib <= 0 or self.capacity.compute_milli < 0:
            raise ValueError(f"Slice {self.id}: capacity must be positive, got {self.capacity}")
