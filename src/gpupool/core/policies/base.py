"""The `Policy` protocol: the score step of filter -> score -> reserve.

The allocator walks each matching group's free index in ascending free VRAM, so the VRAM left after
placement grows along the walk. It stops a group as soon as ``cost_floor`` for the current VRAM left
is >= the best cost found (ties are broken by the walk order, then across groups by
``(cost, free vram, free compute, slice id)``: a total order). A policy without a useful floor
returns ``None`` and the allocator scans every feasible slice (O(S)).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


class Policy(Protocol):
    name: ClassVar[str]

    def cost(self, state: SliceState, demand: Resources) -> int:
        """Integer cost of placing ``demand`` on a slice it fits on; lower is better."""
        ...

    def cost_floor(self, capacity: Resources, vram_left_mib: int) -> int | None:
        """Lower bound of ``cost`` over slices of ``capacity`` leaving >= ``vram_left_mib`` free."""
        ...
