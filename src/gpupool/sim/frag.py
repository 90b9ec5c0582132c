"""FGD's fragmentation measure, vectorised over nodes, with incremental per-node bookkeeping.

For one node (free CPU, per-GPU free milli, GPU model) and one target shape s (cpu_s, per-GPU m_s,
count k_s, allowed models):
- s asks for no GPU, or the node's model is not allowed, or fewer than k_s GPUs have >= m_s free,
  or the node lacks cpu_s: ALL idle GPU milli of the node is fragment for s;
- otherwise only the idle milli on GPUs with free < m_s is fragment for s.
Node fragmentation = sum_s weight_s x fragment_s; cluster fragmentation = sum over nodes.
Memory plays no part (the artifact's measure, used by ``fgd`` and for every reported fragmentation
rate), except in a model built with ``memory=True``: there a node whose free memory is below the
smallest memory request among the pods of s (`TargetWorkload.min_memory_mib`) cannot host s either,
exactly as for CPU (memory is not part of the artifact's shape key, so "one pod of s fits" is asked
of its smallest pod). Our default policy scores with that model; see
`gpupool.sim.policies.balance`, "Memory".

Arithmetic is exact: weights are the integer shape counts of the target workload, so a node's value
is an integer "numerator" (milli x pods); divide by ``total`` for expected milli and by 1000 more
for GPUs. (The artifact sums float probabilities, so its equal-fragmentation comparisons can land a
hair either side of zero; ours land on exactly zero.) Sums are done in float64, which is exact for
these magnitudes (< 2**53).

Vectorisation: per distinct per-GPU request m of the target shapes we keep, per node, ``ge[n, m]``
(GPUs with free >= m) and ``lt[n, m]`` (free milli on GPUs with free < m). A candidate placement
changes one node, so `FragModel.numerators` evaluates any number of hypothetical node states from
those statistics in O(candidates x shapes); `FragTable` keeps the statistics and each node's value
and recomputes only the node a placement touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.workload import TargetWorkload


class FragModel:
    """The target workload compiled to arrays for one cluster's model list."""

    def __init__(self, target: TargetWorkload, models: Sequence[str], *, memory: bool = False) -> None:
        gpu_shapes = [s.gpu_milli for s in target.shapes if s.num_gpu > 0]
        self.levels = np.array(sorted(set(gpu_shapes)) or [1000], dtype=np.int64)
        level_index = {int(v): i for i, v in enumerate(self.levels)}
        self.shape_level = np.array([level_index.get(s.gpu_milli, 0) for s in target.shapes], dtype=np.int64)
        self.shape_k = np.array([s.num_gpu for s in target.shapes], dtype=np.int64)
        self.shape_cpu = np.array([s.cpu_milli for s in target.shapes], dtype=np.int64)
        self.memory = memory
        least = target.min_memory_mib or (0,) * len(target.shapes)
        self.shape_mem = np.array(least, dtype=np.int64)
        self.weights = np.array(target.counts, dtype=np.float64)
        self.total = float(target.total)
        ok = np.zeros((len(models), len(target.shapes)), dtype=bool)
        for j, s in enumerate(target.shapes):
            if s.num_gpu == 0:
                continue  # a CPU shape never uses idle GPU: all of it is fragment
            allowed = set(s.spec_key.split("|")) if s.spec_key else None
            for i, m in enumerate(models):
                ok[i, j] = bool(m) and (allowed is None or m in allowed)
        self.model_ok = ok

    def stats(self, gpu_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ge, lt)`` for rows of per-GPU free milli (shape ``[rows, gpus]``)."""
        f = gpu_free[:, :, None]
        lv = self.levels[None, None, :]
        ge = (f >= lv).sum(axis=1)
        lt = np.where(f < lv, f, 0).sum(axis=1)
        return ge, lt

    def numerators(
        self,
        ge: np.ndarray,
        lt: np.ndarray,
        free_total: np.ndarray,
        cpu_free: np.ndarray,
        model: np.ndarray,
        *,
        mem_free: np.ndarray | None = None,
    ) -> np.ndarray:
        """Fragmentation numerators (float64, exact integers) of hypothetical node states
        (``mem_free`` is read only by a ``memory=True`` model)."""
        ge_s = ge[:, self.shape_level]
        lt_s = lt[:, self.shape_level]
        fits = (ge_s >= self.shape_k) & (cpu_free[:, None] >= self.shape_cpu) & self.model_ok[model]
        if self.memory and mem_free is not None:
            fits &= mem_free[:, None] >= self.shape_mem
        usable = np.where(fits, free_total[:, None] - lt_s, 0).astype(np.float64)
        return self.total * free_total.astype(np.float64) - usable @ self.weights


class FragTable:
    """Per-node statistics and fragmentation numerators for one `MirrorLedger`, kept incrementally.

    ``stats_of``: another table over the same mirror and the same request levels whose per-node
    statistics (``ge``, ``lt``, ``free_total``) this one shares instead of keeping its own; its
    `refresh` then only recomputes this table's values, so the other table must be refreshed first
    (the engine refreshes ``ctx.frag`` before a policy's ``placed``)."""

    def __init__(self, model: FragModel, mirror: MirrorLedger, *, stats_of: FragTable | None = None) -> None:
        self.model = model
        self.mirror = mirror
        self._shared = stats_of is not None
        self.ge: np.ndarray
        self.lt: np.ndarray
        self.free_total: np.ndarray
        if stats_of is not None:
            if stats_of.mirror is not mirror or stats_of.model.levels.tolist() != model.levels.tolist():
                raise ValueError("stats_of must cover the same mirror and request levels")
            self.ge, self.lt, self.free_total = stats_of.ge, stats_of.lt, stats_of.free_total
        else:
            self.ge, self.lt = model.stats(mirror.gpu_free)
            self.free_total = mirror.free_total()
        self.node_frag = model.numerators(
            self.ge,
            self.lt,
            self.free_total,
            mirror.cpu_free,
            mirror.model,
            mem_free=self._mem_after(slice(None), 0),
        )
        self.cluster_frag = float(self.node_frag.sum())

    def refresh(self, node: int) -> None:
        m = self.mirror
        one = slice(node, node + 1)
        if not self._shared:
            row = m.gpu_free[one]
            ge, lt = self.model.stats(row)
            self.ge[node] = ge[0]
            self.lt[node] = lt[0]
            self.free_total[node] = int(row.sum())
        new = self.model.numerators(
            self.ge[one],
            self.lt[one],
            self.free_total[node : node + 1],
            m.cpu_free[node : node + 1],
            m.model[node : node + 1],
            mem_free=self._mem_after(one, 0),
        )[0]
        self.cluster_frag += float(new - self.node_frag[node])
        self.node_frag[node] = new

    def _mem_after(self, nodes: np.ndarray | slice, memory_mib: int) -> np.ndarray | None:
        """Free memory of ``nodes`` after taking ``memory_mib``; None (not computed) for a
        memory-blind model, which never reads it (FGD's own hot path)."""
        return self.mirror.mem_free[nodes] - memory_mib if self.model.memory else None

    def cluster_frag_milli(self) -> float:
        """Cluster fragmentation in expected milli-GPU."""
        return self.cluster_frag / self.model.total

    def after_shared(
        self, nodes: np.ndarray, values: np.ndarray, gpu_milli: int, cpu_milli: int, memory_mib: int = 0
    ) -> np.ndarray:
        """Numerators after placing a 1-GPU share of ``gpu_milli`` on a GPU with ``values`` free."""
        lv = self.model.levels[None, :]
        v = values[:, None]
        w = v - gpu_milli
        ge = self.ge[nodes] - (v >= lv) + (w >= lv)
        lt = self.lt[nodes] - np.where(v < lv, v, 0) + np.where(w < lv, w, 0)
        m = self.mirror
        return self.model.numerators(
            ge,
            lt,
            self.free_total[nodes] - gpu_milli,
            m.cpu_free[nodes] - cpu_milli,
            m.model[nodes],
            mem_free=self._mem_after(nodes, memory_mib),
        )

    def after_whole(self, nodes: np.ndarray, num_gpu: int, cpu_milli: int, memory_mib: int = 0) -> np.ndarray:
        """Numerators after taking ``num_gpu`` fully free GPUs (0 for a CPU-only pod) on each node."""
        m = self.mirror
        ge = self.ge[nodes] - num_gpu  # every level is <= 1000, so each taken card leaves every ge
        lt = self.lt[nodes]  # a card at 0 free adds nothing below any level
        return self.model.numerators(
            ge,
            lt,
            self.free_total[nodes] - 1000 * num_gpu,
            m.cpu_free[nodes] - cpu_milli,
            m.model[nodes],
            mem_free=self._mem_after(nodes, memory_mib),
        )
