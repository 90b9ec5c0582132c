"""Default policy: best fit in BOTH dimensions.

cost = permille of the slice's VRAM left free + permille of its compute left free, after placement.
The tightest slice in VRAM *and* compute wins, so a compute-heavy request does not take the slice a
VRAM-heavy one needed (the seed's VRAM-only best fit ignores compute). Floor: the VRAM term alone.
"""

from __future__ import annotations

from typing import ClassVar

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


class BestFit2D:
    name: ClassVar[str] = "bestfit"

    def cost(self, state: SliceState, demand: Resources) -> int:
        cap = state.slice.capacity
        vram_left = state.free.vram_mib - demand.vram_mib
        compute_left = state.free.compute_milli - demand.compute_milli
        compute_term = compute_left * 1000 // cap.compute_milli if cap.compute_milli else 0
        return vram_left * 1000 // cap.vram_mib + compute_term

    def cost_floor(self, capacity: Resources, vram_left_mib: int) -> int | None:
        return vram_left_mib * 1000 // capacity.vram_mib
