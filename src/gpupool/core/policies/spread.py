"""Spread (worst fit): the slice left with the most free VRAM permille wins. Not monotone: full scan.

Useful for latency-sensitive replicas that should not share a card; O(S) per allocation.
"""

from __future__ import annotations

from typing import ClassVar

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


class Spread:
    name: ClassVar[str] = "spread"
    monotone: ClassVar[bool] = False

    def cost(self, state: SliceState, demand: Resources) -> int:
        cap = state.slice.capacity
        return -((state.free.vram_mib - demand.vram_mib) * 1000 // cap.vram_mib)

    def cost_floor(self, capacity: Resources, vram_left_mib: int, compute_left_milli: int) -> int:
        return -(2**62)
