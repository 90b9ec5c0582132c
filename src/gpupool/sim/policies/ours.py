"""Our policies: FGD's fragmentation gradient without its integer score, plus best-fit tie-breaking.

Why: FGD ranks nodes by ``int(100 x sigmoid(delta_gpus))``. Near delta = 0 one score point is
0.04 GPU, so many placements that differ in fragmentation tie, and ties go to a random node order.
`FragBestFitPolicy` (``frag-bestfit``) instead orders candidate placements lexicographically:
1. largest exact decrease of the node's fragmentation (exact integers, no sigmoid, no truncation);
2. then the least free GPU share left on the node after placement (best fit: keep emptier nodes
   whole for the multi-GPU and whole-card pods that need them);
3. then the least free CPU left on the node; 4. then node order (and GPU index).
It has no tuned constants; the target workload is the same as FGD's.

`OnlineFragBestFitPolicy` (``frag-bestfit-online``) is the same rule against a target workload
learned ONLINE from the pods that have arrived so far (counts per shape, updated on every arrival,
top shapes covering 95 %): it needs no trace-wide knowledge, so it also serves unseen workloads.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import numpy as np

from gpupool.sim.frag import FragModel, FragTable
from gpupool.sim.policies.base import Choice, PodView, SimContext, StatelessPolicy
from gpupool.sim.policies.fgd import candidates, finish
from gpupool.sim.workload import POPULARITY, Shape, TargetWorkload


def _lexi_choice(ctx: SimContext, frag: FragTable, pod: PodView, feasible: np.ndarray) -> Choice:
    ctx_frag = ctx.frag
    ctx.frag = frag
    try:
        rows, gpus, after = candidates(ctx, pod, feasible)
    finally:
        ctx.frag = ctx_frag
    gain = frag.node_frag[rows] - after
    left_gpu = frag.free_total[rows] - pod.total_gpu_milli
    left_cpu = ctx.mirror.cpu_free[rows] - pod.cpu_milli
    order = np.lexsort((left_cpu, left_gpu, -gain))  # last key is primary; stable: tie order stays
    best = int(order[0])
    return finish(ctx, pod, int(rows[best]), int(gpus[best]))


class FragBestFitPolicy(StatelessPolicy):
    name: ClassVar[str] = "frag-bestfit"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        return _lexi_choice(ctx, ctx.frag, pod, feasible)


REBUILD_EVERY = 256


class OnlineFragBestFitPolicy:
    name: ClassVar[str] = "frag-bestfit-online"

    def __init__(self) -> None:
        self._seen: Counter[Shape] = Counter()
        self._frag: FragTable | None = None
        self._since = 0

    def _rebuild(self, ctx: SimContext) -> FragTable:
        ranked = sorted(self._seen.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        need = POPULARITY * sum(self._seen.values())
        kept: list[tuple[Shape, int]] = []
        cum = 0
        for s, n in ranked:
            if cum >= need:
                break
            kept.append((s, n))
            cum += n
        target = TargetWorkload(shapes=tuple(s for s, _ in kept), counts=tuple(n for _, n in kept))
        return FragTable(FragModel(target, ctx.mirror.models), ctx.mirror)

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        self._seen[Shape(pod.cpu_milli, pod.gpu_milli, pod.num_gpu, pod.spec_key)] += 1
        self._since += 1
        if self._frag is None or self._since >= REBUILD_EVERY:
            self._frag = self._rebuild(ctx)
            self._since = 0
        return _lexi_choice(ctx, self._frag, pod, feasible)

    def placed(self, ctx: SimContext, pod: PodView, choice: Choice) -> None:
        if self._frag is not None:
            self._frag.refresh(choice[0])
