"""FGD (Fragmentation Gradient Descent, Weng et al., ATC'23) as the artifact implements it.

Score of a node = ``int(100 x sigmoid((frag_before - frag_after) / 1000))`` with fragmentation in
expected milli-GPU (see `gpupool.sim.frag`); the highest score wins, ties by node order.
- sharing pod: every GPU with enough free share is tried; the best GPU (lowest index among equal
  scores) is the node's score and the GPU used. GPUs of one node with equal free share give the
  same state, so only the first of them is evaluated.
- whole / multi-GPU pod: the lowest-index fully free cards (the artifact's hypothetical placement
  takes the fitting cards with least free share first, i.e. free cards in index order: the same);
- CPU-only pod: only the CPU decrement changes fragmentation.

`candidates` enumerates (node row, GPU, after-numerator) for every distinct hypothetical placement,
ordered by (node row, GPU index); other fragmentation-aware policies (ours) reuse it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.sim.policies.base import MAX_SCORE, Choice, PodView, SimContext, StatelessPolicy, exclusive_gpus


def candidates(
    ctx: SimContext, pod: PodView, feasible: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, gpus, after)``: distinct placements and the node fragmentation numerator after each.

    ``gpus`` is -1 for non-sharing pods (their cards are the lowest-index free ones).
    """
    frag = ctx.frag
    if not pod.is_sharing:
        after = frag.after_whole(feasible, pod.num_gpu, pod.cpu_milli)
        return feasible, np.full(len(feasible), -1, dtype=np.int64), after
    free = ctx.mirror.gpu_free[feasible]
    width = free.shape[1]
    fits = free >= pod.gpu_milli
    if width > 1:
        earlier = np.tri(width, width, -1, dtype=bool).T  # earlier[g', g] = g' < g
        dup = ((free[:, :, None] == free[:, None, :]) & earlier[None, :, :]).any(axis=1)
        fits &= ~dup
    r, g = np.nonzero(fits)
    rows = feasible[r]
    after = frag.after_shared(rows, free[r, g], pod.gpu_milli, pod.cpu_milli)
    return rows, g.astype(np.int64), after


def fgd_scores(ctx: SimContext, rows: np.ndarray, after: np.ndarray) -> np.ndarray:
    delta_gpu = (ctx.frag.node_frag[rows] - after) / ctx.frag.model.total / 1000.0
    out: np.ndarray = np.floor(MAX_SCORE / (1.0 + np.exp(-delta_gpu)))
    return out


def finish(ctx: SimContext, pod: PodView, row: int, gpu: int) -> Choice:
    if pod.num_gpu == 0:
        return row, ()
    if pod.is_sharing:
        return row, (gpu,)
    return row, exclusive_gpus(ctx.mirror.gpu_free[row], pod.num_gpu)


class FGDPolicy(StatelessPolicy):
    name: ClassVar[str] = "fgd"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        rows, gpus, after = candidates(ctx, pod, feasible)
        best = int(np.argmax(fgd_scores(ctx, rows, after)))
        return finish(ctx, pod, int(rows[best]), int(gpus[best]))
