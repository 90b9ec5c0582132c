"""`NodeMemo`: per pod shape, values of hypothetical placements that depend on one node's state only.

Role: a node-level policy scores every feasible (node, GPU) placement of every pod, but a placement
changes one node, and pods of the same shape recur (the default trace's 10,903 arrivals have 151
distinct (GPU milli, GPU count, CPU, memory) shapes). So a value such as "the node's fragmentation
numerator after this pod takes that GPU" is computed once per (shape, node state, GPU) and read
back until the node changes.

Invariants: an entry is returned only while its node's `MirrorLedger.version` equals the version it
was computed at (`MirrorLedger.apply` bumps it), so every value returned equals a fresh computation
(exact: the caller's function of the node's state is deterministic). Bounded: at most
``budget_cells`` cached cells across shapes; the least recently used shape is dropped first (a
shape over the budget alone is computed, never cached). Choices never depend on what is cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np

from gpupool.sim.mirror import MirrorLedger

DEFAULT_BUDGET_CELLS = 4_000_000
"""About 64 MB per memo (a float64 value and an int64 stamp per cell): 400 shapes of a 1,250-node,
8-GPU cluster (the default trace has 151)."""


class NodeMemo:
    def __init__(self, mirror: MirrorLedger, *, budget_cells: int = DEFAULT_BUDGET_CELLS) -> None:
        self.mirror = mirror
        self._shape = mirror.gpu_free.shape
        self._cells = int(self._shape[0]) * int(self._shape[1])
        self._max_keys = budget_cells // max(self._cells, 1)
        self._tables: OrderedDict[Hashable, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def get(
        self,
        key: Hashable,
        rows: np.ndarray,
        cols: np.ndarray,
        compute: Callable[[np.ndarray], np.ndarray],
    ) -> np.ndarray:
        """Values at (``rows[i]``, ``cols[i]``) for the pod shape ``key``; ``compute(mask)`` returns
        the values of the entries selected by the boolean ``mask`` (those not cached or stale)."""
        table = self._tables.get(key)
        if table is None:
            if self._max_keys < 1:
                return compute(np.ones(len(rows), dtype=bool))
            if len(self._tables) >= self._max_keys:
                self._tables.popitem(last=False)
            table = (np.zeros(self._shape, dtype=np.float64), np.full(self._shape, -1, dtype=np.int64))
            self._tables[key] = table
        else:
            self._tables.move_to_end(key)
        values, stamps = table
        now = self.mirror.version[rows]
        got: np.ndarray = values[rows, cols]
        miss = stamps[rows, cols] != now
        if miss.any():
            fresh = compute(miss)
            got[miss] = fresh
            values[rows[miss], cols[miss]] = fresh
            stamps[rows[miss], cols[miss]] = now[miss]
        return got
