"""Whole-card reserve: the expected shortfall of free whole cards for the trace's whole-card pods (ours).

Both FGD's fragmentation and `gpupool.sim.capfrag` weight each shape by its pod COUNT, so the rare
multi-GPU shapes (44 of 8,152 pods on the default trace, but 5.8 % of its GPU demand) barely count, and
a tie-breaker that spreads work by capacity gain breaks the last fully free 8-card nodes early (default,
seed 42: 9 fully free 8-card nodes left at 80 % allocated under `fgd-capacity`, 96 under FGD, whose
node-order tie rule concentrates work). This table asks, per whole-card group g = (GPU count k,
allowed models) of the shape distribution, whether the cluster still has the whole cards that g's
EXPECTED FUTURE demand needs:

    demand_g   = sum over whole-card shapes s in g of count_s x k_s x 1000   (GPU milli)
    demand     = sum over all shapes of count_s x k_s x milli_s
    expected_g = demand_g / demand x free_milli      (the rest of the cluster fills with the same mix)
    supply_g   = 1000 x k x sum over nodes of allowed x floor(full free cards / k)
    shortfall  = sum_g max(0, expected_g - supply_g)            (milli of whole-card demand at risk)

Kept in exact integers by multiplying through by ``demand``. No constants: the horizon is the cluster's
own free capacity and the mix is the trace's shape distribution. ``slots[n, g]`` is kept per node and a
placement changes one node (`refresh`), so ``supply`` is incremental; free GPU is read from the mirror.
"""

from __future__ import annotations

import numpy as np

from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.trace import MILLI_PER_GPU
from gpupool.sim.workload import TargetWorkload


class WholeCardReserve:
    def __init__(self, population: TargetWorkload, mirror: MirrorLedger) -> None:
        self.mirror = mirror
        groups: dict[tuple[int, str], int] = {}
        demand = 0
        for s, c in zip(population.shapes, population.counts, strict=True):
            demand += c * s.gpu_milli * s.num_gpu
            if s.num_gpu >= 1 and s.gpu_milli == MILLI_PER_GPU:
                key = (s.num_gpu, s.spec_key)
                groups[key] = groups.get(key, 0) + c * s.gpu_milli * s.num_gpu
        self.demand = max(demand, 1)
        self.k = np.array([k for k, _ in groups] or [1], dtype=np.int64)
        self.group_demand = np.array(list(groups.values()) or [0], dtype=np.int64)
        allowed = np.zeros((len(mirror.models), len(self.k)), dtype=bool)
        for j, (_, spec) in enumerate(groups):
            names = set(spec.split("|")) if spec else None
            for i, m in enumerate(mirror.models):
                allowed[i, j] = bool(m) and (names is None or m in names)
        self.allowed = allowed
        self.slots = self._slots(self._full(mirror.gpu_free), mirror.model)
        self.supply = self.slots.sum(axis=0)

    @staticmethod
    def _full(gpu_free: np.ndarray) -> np.ndarray:
        out: np.ndarray = (gpu_free == MILLI_PER_GPU).sum(axis=1)
        return out

    def _slots(self, full: np.ndarray, model: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.where(self.allowed[model], full[:, None] // self.k[None, :], 0)
        return out

    def _shortfall(self, supply: np.ndarray, free_milli: int) -> np.ndarray:
        """``demand`` x shortfall (exact int64) for each row of ``supply`` [candidates, groups]."""
        expected = self.group_demand * free_milli
        have = supply * self.k[None, :] * (MILLI_PER_GPU * self.demand)
        out: np.ndarray = np.maximum(expected[None, :] - have, 0).sum(axis=1)
        return out

    def shortfall_after(self, rows: np.ndarray, cards_taken: np.ndarray, gpu_milli: int) -> np.ndarray:
        """Scaled shortfall after taking ``cards_taken[i]`` full cards and ``gpu_milli`` on ``rows[i]``."""
        m = self.mirror
        full = self._full(m.gpu_free[rows]) - cards_taken
        supply = self.supply[None, :] - self.slots[rows] + self._slots(full, m.model[rows])
        return self._shortfall(supply, self.free_milli - gpu_milli)

    def refresh(self, node: int) -> None:
        m = self.mirror
        row = self._slots(self._full(m.gpu_free[node : node + 1]), m.model[node : node + 1])[0]
        self.supply += row - self.slots[node]
        self.slots[node] = row

    @property
    def free_milli(self) -> int:
        """The cluster's free GPU milli (read from the mirror: a 10k-element sum per pod)."""
        return int(self.mirror.gpu_free.sum())
