"""Whole-card reserve: the expected shortfall of free whole cards for the trace's whole-card pods (ours).

Both FGD's fragmentation and `gpupool.sim.capfrag` weight each shape by its pod COUNT, so the rare
multi-GPU shapes (44 of 8,152 pods on the default trace, but 5.8 % of its GPU demand) barely count, and
a tie-breaker that spreads work by capacity gain breaks the last fully free 8-card nodes early. This
table asks, per whole-card group g = (GPU count k, CPU milli, allowed models) of the shape
distribution, whether the cluster still has the node slots that g's EXPECTED FUTURE demand needs:

    demand_g   = sum over whole-card shapes s in g of count_s x k_s x 1000          (GPU milli)
    demand     = sum over all shapes of count_s x k_s x milli_s
    D_g        = sum of demand_h over the groups h that DOMINATE g: k_h >= k_g, cpu_h >= cpu_g and
                 allowed_h a subset of allowed_g (a slot that serves h also serves g, so h's demand
                 competes for g's slots: Hall's condition, group by group)
    expected_g = D_g / demand x free_milli         (the rest of the cluster fills with the same mix)
    slots_g(n) = allowed(n, g) x min(floor(full free cards / k), floor(free CPU / cpu))
    supply_g   = 1000 x k x sum over nodes of slots_g(n)
    shortfall  = sum_g max(0, expected_g - supply_g)            (milli of whole-card demand at risk)

Why CPU is in the slot: on `multigpu30`, the 8-GPU pods asking for 120 cores fit only the 39 nodes
with 128 cores; a CPU-blind reserve counts every fully free 8-card node as a slot for them and lets
the 96-core ones absorb the demand meant for the others (and CPU-only or GPU-sharing pods change the
supply too, through the CPU they take). Why dominated demand: without it, the 1-card group would see
only 1-card demand and spend the cards that 8-card pods also need.

The horizon (``cpu_horizon=True``, the default policy's reserve): the free GPU is the future demand
only if the mix can still reach it. Future pods bring ``cpu_demand`` milli-cores of CPU per
``demand`` milli-GPU (the same shape counts, CPU-only shapes included), so the free CPU carries at
most ``free_cpu x demand / cpu_demand`` milli of future GPU request; the horizon is the smaller of the
two. Without it (``fgd-reserve``), a CPU-heavy mix (GPU pods asking 3x the trace's CPU) shows a
shortfall from the first pod of the run on: every group's slots are CPU-bound while its "expected"
demand is sized by a GPU capacity the CPU can never fill, so the reserve overrides FGD's choice on
57 % of the placements (variant ``cpu300``, seed 42: 2,328 of 4,082) and leaves more GPU unallocated
than FGD (52.81 vs 52.40 %). With the CPU horizon the overrides fall to 1,565 and the run beats FGD
(52.03 %).

Servable demand (``servable=True``, the default policy's reserve): a group whose expected demand
exceeds even the EMPTY cluster's slots for it cannot be served in full by any placement. Counting
all of it makes the group short from the first pod on, and the reserve then overrides FGD on every
placement that touches one of the group's slots, all run long, to close a gap no placement can
close. (Variant ``multi50``: half the GPU request in multi-GPU pods makes the 1-card group with
24.2 cores dominated by every multi-GPU shape with at least that CPU: expected 2,976 GPUs at the
start against 2,830 slots; the CPU-horizon reserve reported a shortfall on 5,152 of 5,397
placements and overrode FGD on 967, and lost to FGD, 2.83 vs 2.76 % unallocated.) So each group
plans for at most the share of the horizon its slots served at the start:

    share_g = min(D_g / demand, 1000 x k x slots_g(empty) / horizon(empty))

and ``expected_g = share_g x horizon`` as before. A group the empty cluster can serve keeps its
share (every published workload: nothing changes there); an oversubscribed one starts at shortfall 0
and is defended only when its slots are lost faster than the cluster fills. No constant: the cap is
the cluster's own empty-state slots.

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
    def __init__(
        self,
        population: TargetWorkload,
        mirror: MirrorLedger,
        *,
        cpu_horizon: bool = False,
        servable: bool = False,
    ) -> None:
        self.mirror = mirror
        self.cpu_horizon = cpu_horizon
        groups: dict[tuple[int, int, str], int] = {}
        demand = 0
        cpu_demand = 0
        for s, c in zip(population.shapes, population.counts, strict=True):
            demand += c * s.gpu_milli * s.num_gpu
            cpu_demand += c * s.cpu_milli
            if s.num_gpu >= 1 and s.gpu_milli == MILLI_PER_GPU:
                key = (s.num_gpu, max(s.cpu_milli, 1), s.spec_key)
                groups[key] = groups.get(key, 0) + c * s.gpu_milli * s.num_gpu
        if not groups:  # no whole-card shape: one empty group keeps the shapes of the arrays valid
            groups[(1, 1, "")] = 0
        self.demand = max(demand, 1)
        self.cpu_demand = max(cpu_demand, 1)
        keys = list(groups)
        self.k = np.array([k for k, _, _ in keys], dtype=np.int64)
        self.cpu = np.array([c for _, c, _ in keys], dtype=np.int64)
        allowed = np.zeros((len(mirror.models), len(keys)), dtype=bool)
        for j, (_, _, spec) in enumerate(keys):
            names = set(spec.split("|")) if spec else None
            for i, m in enumerate(mirror.models):
                allowed[i, j] = bool(m) and (names is None or m in names)
        self.allowed = allowed
        # `_slots`' fast path: floor(full / k) read from a table per full-card count, floor(cpu /
        # cpu_g) as float64 division then truncation (exact: both operands are integers far below
        # 2**53 and non-negative), disallowed models as a 0/1 factor
        top = int(mirror.gpu_count.max(initial=0))
        self._by_full = np.arange(top + 1, dtype=np.int64)[:, None] // self.k[None, :]
        self._cpu_f = self.cpu.astype(np.float64)
        self._allowed_01 = allowed.astype(np.int64)
        group_demand = np.array(list(groups.values()), dtype=np.int64)
        subset = (allowed[:, :, None] <= allowed[:, None, :]).all(axis=0)  # [h, g]: allowed_h <= allowed_g
        dominates = (self.k[:, None] >= self.k[None, :]) & (self.cpu[:, None] >= self.cpu[None, :]) & subset
        self.dominated_demand: np.ndarray = (dominates * group_demand[:, None]).sum(axis=0)
        self.full = self._full(mirror.gpu_free)
        """Per node, its fully free cards (kept by `refresh`, like ``slots``)."""
        self.slots = self._slots(self.full, mirror.cpu_free, mirror.model)
        self.supply: np.ndarray = self.slots.sum(axis=0)
        if servable:
            self.dominated_demand = np.minimum(self.dominated_demand, self._servable_cap())

    def _servable_cap(self) -> np.ndarray:
        """Per group, ``demand`` x the share of the horizon its slots serve on the EMPTY cluster
        (every card free, every core free), rounded down: see "Servable demand" above."""
        m = self.mirror
        empty = self._slots(m.gpu_count, m.cpu_cap, m.model).sum(axis=0)
        horizon = m.capacity_milli
        if self.cpu_horizon:
            horizon = min(horizon, int(m.cpu_cap.sum()) * self.demand // self.cpu_demand)
        out: np.ndarray = empty * self.k * MILLI_PER_GPU * self.demand // max(horizon, 1)
        return out

    @staticmethod
    def _full(gpu_free: np.ndarray) -> np.ndarray:
        out: np.ndarray = (gpu_free == MILLI_PER_GPU).sum(axis=1)
        return out

    def _slots(self, full: np.ndarray, cpu_free: np.ndarray, model: np.ndarray) -> np.ndarray:
        """Per row and group: ``min(floor(full / k), floor(free CPU / cpu_g))``, 0 where the model
        is not allowed (the fast path computes the same integers; see ``__init__``)."""
        if len(full) and (full.min() < 0 or full.max() >= len(self._by_full)):
            by_gpu = full[:, None] // self.k[None, :]
            by_cpu = np.maximum(cpu_free, 0)[:, None] // self.cpu[None, :]
            slow: np.ndarray = np.where(self.allowed[model], np.minimum(by_gpu, by_cpu), 0)
            return slow
        cpu = np.maximum(cpu_free, 0).astype(np.float64)
        by_cpu = (cpu[:, None] / self._cpu_f[None, :]).astype(np.int64)
        out: np.ndarray = np.minimum(self._by_full[full], by_cpu) * self._allowed_01[model]
        return out

    def _shortfall(self, supply: np.ndarray, free_milli: int) -> np.ndarray:
        """``demand`` x shortfall (exact int64) for each row of ``supply`` [candidates, groups]."""
        expected = self.dominated_demand * free_milli
        have = supply * self.k[None, :] * (MILLI_PER_GPU * self.demand)
        out: np.ndarray = np.maximum(expected[None, :] - have, 0).sum(axis=1)
        return out

    def shortfall_after(
        self, rows: np.ndarray, cards_taken: np.ndarray, gpu_milli: int, cpu_milli: int
    ) -> np.ndarray:
        """Scaled shortfall after a pod takes ``cards_taken[i]`` full cards, ``gpu_milli`` and
        ``cpu_milli`` on ``rows[i]``."""
        m = self.mirror
        # The value depends on the candidate node only through (full cards, cards taken, free CPU,
        # model): nodes alike (most of them, early in a run) are computed once.
        full, cpu, model = self.full[rows], m.cpu_free[rows], m.model[rows]
        key = (cpu * (len(self._by_full) + 1) + full) * (int(cards_taken.max(initial=0)) + 1) + cards_taken
        _, first, inverse = np.unique(key * len(m.models) + model, return_index=True, return_inverse=True)
        u = rows[first]
        after = self._slots(full[first] - cards_taken[first], cpu[first] - cpu_milli, model[first])
        horizon = self.horizon_milli(gpu_milli, cpu_milli)
        # a node that keeps its slots leaves the cluster's supply as it is: one value
        changed = np.flatnonzero((after != self.slots[u]).any(axis=1))
        out = np.full(len(u), int(self._shortfall(self.supply[None, :], horizon)[0]), dtype=np.int64)
        if len(changed):
            supply = self.supply[None, :] - self.slots[u[changed]] + after[changed]
            out[changed] = self._shortfall(supply, horizon)
        result: np.ndarray = out[inverse.reshape(-1)]
        return result

    def never_short(self, cards: int, gpu_milli: int, cpu_milli: int) -> bool:
        """True when NO placement of a pod taking at most ``cards`` full cards, ``gpu_milli`` and
        ``cpu_milli`` can leave a shortfall. Exact, not a guess (`shortfall_after` would return 0
        for every candidate, so callers may skip it): a node's slots of g are
        ``min(floor(full / k), floor(cpu / cpu_g))``, and taking ``cards`` cards and ``cpu_milli``
        lowers a minimum of two terms by at most the larger drop, ``max(ceil(cards / k),
        ceil(cpu_milli / cpu_g))``, and never below zero (no node holds more than the most any holds)."""
        drop = np.maximum(-(-cards // self.k), -(-cpu_milli // self.cpu))
        worst = self.supply - np.minimum(self.slots.max(axis=0), drop)
        return bool((self._shortfall(worst[None, :], self.horizon_milli(gpu_milli, cpu_milli)) == 0).all())

    def horizon_milli(self, gpu_milli: int = 0, cpu_milli: int = 0) -> int:
        """The GPU milli that future pods of the mix can still take: free GPU, and (with
        ``cpu_horizon``) no more than the free CPU carries at the mix's GPU-per-CPU ratio."""
        free = self.free_milli - gpu_milli
        if not self.cpu_horizon:
            return free
        cpu = int(self.mirror.cpu_free.sum()) - cpu_milli
        return min(free, cpu * self.demand // self.cpu_demand)

    def refresh(self, node: int) -> None:
        m = self.mirror
        one = slice(node, node + 1)
        full = self._full(m.gpu_free[one])
        row = self._slots(full, m.cpu_free[one], m.model[one])[0]
        self.full[node] = full[0]
        self.supply += row - self.slots[node]
        self.slots[node] = row

    @property
    def free_milli(self) -> int:
        """The cluster's free GPU milli (read from the mirror: a 10k-element sum per pod)."""
        return int(self.mirror.gpu_free.sum())
