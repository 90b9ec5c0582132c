"""The seed's policy, kept by name as a baseline: least absolute VRAM MiB left; compute only filters."""

from __future__ import annotations

from typing import ClassVar

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


class SeedBestFit:
    name: ClassVar[str] = "seed-bestfit"
    monotone: ClassVar[bool] = True

    def cost(self, state: SliceState, demand: Resources) -> int:
        return state.free.vram_mib - demand.vram_mib

    def cost_floor(self, capacity: Resources, vram_left_mib: int, compute_left_milli: int) -> int:
        return vram_left_mib
