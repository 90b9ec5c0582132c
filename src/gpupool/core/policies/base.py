"""The `Policy` protocol: the score step of filter -> score -> reserve.

A policy returns an integer cost for placing a demand on a slice it fits on (lower is better).
The allocator breaks ties by ``(cost, free vram, free compute, slice id)``: a total order.

Fast path: a policy that declares ``monotone = True`` promises that its cost never decreases when
the slice would be left with more VRAM or more compute (all best-fit flavours). The ledger then
offers, per free-compute bucket (ascending), only the bucket's tightest slice, and the allocator
stops as soon as ``cost_floor(capacity, 0, compute_left)`` exceeds the best cost found, so a query
visits a few buckets instead of every slice. A non-monotone policy (spread) gets every feasible
slice: O(S).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from gpupool.core.ledger import SliceState
from gpupool.hardware.units import Resources


class Policy(Protocol):
    name: ClassVar[str]
    monotone: ClassVar[bool]

    def cost(self, state: SliceState, demand: Resources) -> int:
        """Integer cost of placing ``demand`` on a slice it fits on; lower is better."""
        ...

    def cost_floor(self, capacity: Resources, vram_left_mib: int, compute_left_milli: int) -> int:
        """Lower bound of ``cost`` over slices of ``capacity`` leaving at least these amounts free."""
        ...
