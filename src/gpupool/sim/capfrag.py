"""A capacity-aware fragmentation measure (ours), vectorised and incremental like `gpupool.sim.frag`.

FGD asks of each target shape s "does ONE pod of s fit on this node?" and, if so, calls all idle
share on GPUs with enough free share usable. That misses two losses that decide the last few percent:
- CPU stranding: a node with four free cards but CPU for one more pod of s can use one card, not four;
- in-card rounding: a card with 1000 free hosts two 470-milli pods, so 60 milli of it is lost to s.
This measure asks instead "how much of the node's idle GPU could pods of s consume if the node were
filled with them?":

    slots_gpu(s) = (sum over GPUs of floor(free_i / m_s)) // k_s      (k_s cards of m_s each)
    slots_cpu(s) = floor(free_cpu / cpu_s)
    usable(s)    = min(slots_gpu, slots_cpu) x m_s x k_s   (0 for CPU-only shapes or disallowed models)
    fragment(s)  = idle - usable(s);   node value = sum_s count_s x fragment(s)

It is always >= FGD's value for the same node (a superset of what FGD calls fragment), uses the same
integer shape counts (exact arithmetic) and no constants. Per node and per distinct per-GPU request
level L we keep ``slots[n, L] = sum_i floor(free_i / L)``; a placement changes one node.
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.trace import MILLI_PER_GPU
from gpupool.sim.workload import TargetWorkload


class CapacityFragTable:
    def __init__(self, target: TargetWorkload, mirror: MirrorLedger) -> None:
        self.mirror = mirror
        shapes = target.shapes
        self.levels = np.array(
            sorted({s.gpu_milli for s in shapes if s.num_gpu > 0}) or [1000], dtype=np.int64
        )
        index = {int(v): i for i, v in enumerate(self.levels)}
        self.shape_level = np.array([index.get(s.gpu_milli, 0) for s in shapes], dtype=np.int64)
        self.shape_k = np.array([max(s.num_gpu, 1) for s in shapes], dtype=np.int64)
        self.k_f = self.shape_k.astype(np.float64)
        cpu = np.array([s.cpu_milli for s in shapes], dtype=np.float64)
        self.cpu_free_shape = cpu == 0  # a shape asking no CPU is never CPU-limited, even at 0 free
        self.cpu_f = np.where(self.cpu_free_shape, 1.0, cpu)
        self.shape_milli = np.array([s.gpu_milli * s.num_gpu for s in shapes], dtype=np.int64)
        self.weights = np.array(target.counts, dtype=np.float64)
        self.total = float(target.total)
        ok = np.zeros((len(mirror.models), len(shapes)), dtype=bool)
        for j, s in enumerate(shapes):
            if s.num_gpu == 0:
                continue
            allowed = set(s.spec_key.split("|")) if s.spec_key else None
            for i, m in enumerate(mirror.models):
                ok[i, j] = bool(m) and (allowed is None or m in allowed)
        self.model_ok = ok
        self.ok_milli = np.where(ok, self.shape_milli[None, :], 0).astype(np.float64)
        self.slots = self._stats(mirror.gpu_free)
        self.free_total = mirror.free_total()
        self.node_frag = self.numerators(self.slots, self.free_total, mirror.cpu_free, mirror.model)

    def _stats(self, gpu_free: np.ndarray) -> np.ndarray:
        out: np.ndarray = (gpu_free[:, :, None] // self.levels[None, None, :]).sum(axis=1)
        return out

    def numerators(
        self, slots: np.ndarray, free_total: np.ndarray, cpu_free: np.ndarray, model: np.ndarray
    ) -> np.ndarray:
        # float64 floor-division is exact here (integers < 2**53; true division rounds correctly)
        gpu_slots = np.floor(slots[:, self.shape_level] / self.k_f)
        cpu_slots = np.floor(np.maximum(cpu_free, 0).astype(np.float64)[:, None] / self.cpu_f)
        cpu_slots = np.where(self.cpu_free_shape, np.inf, cpu_slots)
        usable = np.minimum(gpu_slots, cpu_slots) * self.ok_milli[model]
        out: np.ndarray = self.total * free_total.astype(np.float64) - usable @ self.weights
        return out

    def refresh(self, node: int) -> None:
        m = self.mirror
        row = m.gpu_free[node : node + 1]
        self.slots[node] = self._stats(row)[0]
        self.free_total[node] = int(row.sum())
        self.node_frag[node] = self.numerators(
            self.slots[node : node + 1],
            self.free_total[node : node + 1],
            m.cpu_free[node : node + 1],
            m.model[node : node + 1],
        )[0]

    def after_shared(
        self, nodes: np.ndarray, values: np.ndarray, gpu_milli: int, cpu_milli: int, memory_mib: int = 0
    ) -> np.ndarray:
        """(``memory_mib`` is ignored: memory plays no part in this measure.)"""
        lv = self.levels[None, :]
        v = values[:, None]
        slots = self.slots[nodes] - v // lv + (v - gpu_milli) // lv
        m = self.mirror
        return self.numerators(
            slots, self.free_total[nodes] - gpu_milli, m.cpu_free[nodes] - cpu_milli, m.model[nodes]
        )

    def after_whole(self, nodes: np.ndarray, num_gpu: int, cpu_milli: int, memory_mib: int = 0) -> np.ndarray:
        slots = self.slots[nodes] - num_gpu * (MILLI_PER_GPU // self.levels)[None, :]
        m = self.mirror
        return self.numerators(
            slots,
            self.free_total[nodes] - MILLI_PER_GPU * num_gpu,
            m.cpu_free[nodes] - cpu_milli,
            m.model[nodes],
        )
