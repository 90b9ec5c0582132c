"""`MirrorLedger`: the simulator's vectorised copy of per-node state, kept in node tie-break order.

Role: node-level policies (FGD and friends) score every node per pod; walking the core's per-slice
ledger for that would cost O(slices) Python calls per pod. The mirror holds the same books as numpy
arrays so a policy scores all nodes at once; every placement is still COMMITTED through the core's
`Allocator.place`, and `engine.cross_check` asserts the two agree (per step in tests, once per run
otherwise).

What lives where (the design choice the issue asks to document):
- per-GPU free share (milli, 1000 = whole card) is in BOTH: the core ledgers it as ``compute_milli``
  of one WHOLE slice per GPU; the mirror as ``gpu_free[node, gpu]``;
- node CPU, node memory and the GPU model constraint (``gpu_spec``) are simulator-side filters, held
  only here: the core's `Resources` is (VRAM, compute) per GPU and a node's host CPU/memory is not a
  GPU resource, so adding them to the core would widen every lease for one simulator's needs;
- CPU-only pods (no GPU) never reach the core (a core `Request` asks for at least one GPU); they only
  consume mirror CPU/memory.

Invariants: rows are nodes in tie order (row 0 wins every tie); ``0 <= gpu_free <= 1000`` on real
GPUs and ``gpu_free == 0`` on padding columns (absent GPUs never fit and add nothing to any sum);
``0 <= cpu_free <= cpu capacity`` and the same for memory. State changes go through `apply`,
which also keeps ``first_of_value`` and bumps the node's ``version`` (what `gpupool.sim.memo` and
the placement enumeration rely on); code that writes the arrays directly calls `resync` after.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec


class MirrorLedger:
    def __init__(self, nodes_in_tie_order: Sequence[NodeSpec]) -> None:
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes_in_tie_order)
        len(self.nodes)
        width = max([nd.gpu_count for nd in self.nodes] + [1])
        self.models: tuple[str, ...] = tuple(sorted({nd.gpu_model for nd in self.nodes}))
        model_index = {m: i for i, m in enumerate(self.models)}
        self.model = np.array([model_index[nd.gpu_model] for nd in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([nd.gpu_count for nd in self.nodes], dtype=np.int64)
        self.gpu_exists = np.arange(width)[None, :] < self.gpu_count[:, None]
        self.gpu_free = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.cpu_cap = np.array([nd.cpu_milli for nd in self.nodes], dtype=np.int64)
        self.mem_cap = np.array([nd.memory_mib for nd in self.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.capacity_milli = int(self.gpu_count.sum()) * MILLI_PER_GPU
        self.version = np.zeros(len(self.nodes), dtype=np.int64)
        """Per node, how many placements changed it: a value computed from a node's state alone
        stays valid while its node's version is unchanged (`gpupool.sim.memo`)."""
        self.first_of_value = self._first_of_value(self.gpu_free)
        """Per node and GPU: no lower-index GPU of the node has the same free milli (kept by
        `apply`); the placements of a sharing pod are one per distinct free value."""

    def resync(self) -> None:
        """Recompute what `apply` keeps after a caller wrote ``gpu_free``, ``cpu_free`` or
        ``mem_free`` directly (tests building a state); every node counts as changed."""
        self.first_of_value = self._first_of_value(self.gpu_free)
        self.version += 1

    @staticmethod
    def _first_of_value(gpu_free: np.ndarray) -> np.ndarray:
        width = gpu_free.shape[1]
        if width == 1:
            return np.ones(gpu_free.shape, dtype=bool)
        earlier = np.tri(width, width, -1, dtype=bool).T  # earlier[g', g] = g' < g
        dup = ((gpu_free[:, :, None] == gpu_free[:, None, :]) & earlier[None, :, :]).any(axis=1)
        out: np.ndarray = ~dup
        return out

    def __len__(self) -> int:
        return len(self.nodes)

    def free_total(self) -> np.ndarray:
        out: np.ndarray = self.gpu_free.sum(axis=1)
        return out

    def apply(
        self, node: int, gpus: Sequence[int], *, gpu_milli: int, cpu_milli: int, memory_mib: int
    ) -> None:
        """Book one placement; raises `AssertionError` (a simulator bug) if it does not fit."""
        assert self.cpu_free[node] >= cpu_milli, (node, int(self.cpu_free[node]), cpu_milli)
        assert self.mem_free[node] >= memory_mib, (node, int(self.mem_free[node]), memory_mib)
        for g in gpus:
            assert self.gpu_exists[node, g] and self.gpu_free[node, g] >= gpu_milli, (node, g, gpu_milli)
            self.gpu_free[node, g] -= gpu_milli
        self.cpu_free[node] -= cpu_milli
        self.mem_free[node] -= memory_mib
        self.first_of_value[node] = self._first_of_value(self.gpu_free[node : node + 1])[0]
        self.version[node] += 1

    def slice_id(self, node: int, gpu: int) -> str:
        return f"{self.nodes[node].name}/gpu{gpu}"
