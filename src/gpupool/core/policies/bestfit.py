"""Default policy: best fit in BOTH dimensions.

cost = permille of the slice's VRAM left free + permille of its compute left free, after placement.
The tightest slice in VRAM *and* compute wins, so a compute-heavy request does not take the slice a
VRAM-heavy one needed (the seed's VRAM-only best fit ignores compute). Monotone in both dimensions.
"""

from __future__ import annotations

from typing import ClassVar

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


def _permille(left: int, capacity: int) -> int:
    return left * 1000 // capacity if capacity else 0


class BestFit2D:
    name: ClassVar[str] = "bestfit"
    monotone: ClassVar[bool] = True

    def cost(self, state: SliceState, demand: Resources) -> int:
        cap = state.slice.capacity
        return _permille(state.free.vram_mib - demand.vram_mib, cap.vram_mib) + _permille(
            state.free.compute_milli - demand.compute_milli, cap.compute_milli
        )

    def cost_floor(self, capacity: Resources, vram_left_mib: int, compute_left_milli: int) -> int:
        return _permille(vram_left_mib, capacity.vram_mib) + _permille(
            compute_left_milli, capacity.compute_milli
        )
