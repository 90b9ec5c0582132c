"""`Inventory`: an immutable node -> GPU -> slice view built from a plan or from discovery.

Role: the hand-over point between layer 1 (planner, device sources) and layer 2 (the allocator).

Invariants:
- Slice ids are unique across the inventory (checked at construction).
- Every slice of one ``gpu_id`` is on the same node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpupool.hardware.slices import Slice


@dataclass(frozen=True, slots=True)
class Inventory:
    slices: tuple[Slice, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        gpu_node: dict[str, str] = {}
        for s in self.slices:
            if s.id in seen:
                raise ValueError(f"duplicate slice id {s.id!r} in inventory")
            seen.add(s.id)
            node = gpu_node.setdefault(s.gpu_id, s.node)
            if node != s.node:
                raise ValueError(f"GPU {s.gpu_id!r} appears on two nodes: {node!r} and {s.node!r}")

    @classmethod
    def of(cls, slices: Iterable[Slice]) -> Inventory:
        return cls(tuple(slices))

    def __iter__(self) -> Iterator[Slice]:
        return iter(self.slices)

    def __len__(self) -> int:
        return len(self.slices)

    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({s.node for s in self.slices}))

    def gpus(self) -> tuple[str, ...]:
        return tuple(sorted({s.gpu_id for s in self.slices}))

    def on_gpu(self, gpu_id: str) -> tuple[Slice, ...]:
        return tuple(s for s in self.slices if s.gpu_id == gpu_id)
