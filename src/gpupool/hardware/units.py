"""Integer resource units and the two-dimensional `Resources` vector.

Role: the one place that defines how capacity is counted. Everything the allocator ledgers is an
integer: VRAM in MiB and compute in milli-GPU (1000 = all SMs of one physical GPU; the seed's
"compute percent" is 10 x percent, the Alibaba trace's ``gpu_milli`` maps one to one).

Invariants:
- `Resources` fields are plain ``int`` (checked at the boundaries with `check_ints`, not on every
  construction, because the allocator builds many); arithmetic is exact.
- A `Resources` may be negative only as an intermediate difference; ``is_nonnegative`` tells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

MiB = NewType("MiB", int)
MilliGPU = NewType("MilliGPU", int)

COMPUTE_MILLI_PER_GPU = 1000
"""Compute of one whole physical GPU, in milli-GPU."""

MIB_PER_GIB = 1024


def compute_milli_from_pct(pct: int) -> int:
    """Convert the seed's compute percent (0-100 of one GPU) to milli-GPU."""
    return int(pct) * 10


@dataclass(frozen=True, slots=True, order=True)
class Resources:
    """VRAM MiB x compute milli-GPU. Ordered lexicographically (VRAM first) for stable sorting."""

    vram_mib: int
    compute_milli: int

    # NOTE: no __post_init__ type check: Resources is built on every allocator step. Inputs are
    # checked where they enter (`check_ints`, request validation, Slice construction).

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.vram_mib + other.vram_mib, self.compute_milli + other.compute_milli)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.vram_mib - other.vram_mib, self.compute_milli - other.compute_milli)

    def fits_in(self, other: Resources) -> bool:
        """True when this vector is <= ``other`` in both dimensions."""
        return self.vram_mib <= other.vram_mib and self.compute_milli <= other.compute_milli

    def is_nonnegative(self) -> bool:
        return self.vram_mib >= 0 and self.compute_milli >= 0

    def is_zero(self) -> bool:
        return self.vram_mib == 0 and self.compute_milli == 0

    def __str__(self) -> str:
        return f"{self.vram_mib} MiB x {self.compute_milli} mGPU"


ZERO = Resources(0, 0)


def check_ints(res: Resources, *, field: str) -> Resources:
    """Raise `TypeError` naming ``field`` unless both dimensions are plain ints (not bool/float)."""
    for name in ("vram_mib", "compute_milli"):
        value = getattr(res, name)
        if type(value) is not int:
            raise TypeError(f"{field}.{name} must be int, got {type(value).__name__} {value!r}")
    return res
