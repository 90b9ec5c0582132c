"""FGD (Fragmentation Gradient Descent, Weng et al., ATC'23) as the artifact implements it.

Score of a node = ``int(100 x sigmoid((frag_before - frag_after) / 1000))`` with fragmentation in
expected milli-GPU (see `gpupool.sim.frag`); the highest score wins, ties by node order.
- sharing pod: every GPU with enough free share is tried; the best GPU (lowest index among equal
  scores) is the node's score and the GPU used. GPUs of one node with equal free share give the
  same state, so only the first of them is evaluated.
- whole / multi-GPU pod: the lowest-index fully free cards (the artifact's hypothetical placement
  takes the fitting cards with least free share first, i.e. free cards in index order: the same);
- CPU-only pod: only the CPU decrement changes fragmentation.

`placements` enumerates the distinct hypothetical placements and `after` evaluates them under any
fragmentation table; other fragmentation-aware policies (ours) reuse both.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np

from gpupool.sim.frag import FragTable
from gpupool.sim.policies.base import MAX_SCORE, Choice, PodView, SimContext, StatelessPolicy, exclusive_gpus


class FragLike(Protocol):
    """What `after` needs from a fragmentation table (`FragTable`, `CapacityFragTable`)."""

    node_frag: np.ndarray

    def after_shared(
        self, nodes: np.ndarray, values: np.ndarray, gpu_milli: int, cpu_milli: int, memory_mib: int = 0
    ) -> np.ndarray: ...

    def after_whole(
        self, nodes: np.ndarray, num_gpu: int, cpu_milli: int, memory_mib: int = 0
    ) -> np.ndarray: ...


def placements(
    ctx: SimContext, pod: PodView, feasible: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, gpus, values)``: distinct hypothetical placements, ordered by (node row, GPU index).

    A sharing pod: one entry per (node, distinct free value of a fitting GPU), the lowest GPU index of
    that value, ``values`` its free share. Otherwise one entry per node, ``gpus`` = -1 (the cards are
    the lowest-index free ones) and ``values`` = 0.
    """
    if not pod.is_sharing:
        zeros = np.zeros(len(feasible), dtype=np.int64)
        return feasible, zeros - 1, zeros
    free = ctx.mirror.gpu_free[feasible]
    fits = (free >= pod.gpu_milli) & ctx.mirror.first_of_value[feasible]
    r, g = np.nonzero(fits)
    return feasible[r], g.astype(np.int64), free[r, g]


def after(table: FragLike, pod: PodView, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The node fragmentation numerator of each placement from `placements`, under ``table``."""
    if pod.is_sharing:
        return table.after_shared(rows, values, pod.gpu_milli, pod.cpu_milli, pod.memory_mib)
    return table.after_whole(rows, pod.num_gpu, pod.cpu_milli, pod.memory_mib)


def candidates(
    ctx: SimContext, pod: PodView, feasible: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, gpus, after)`` under FGD's measure (``ctx.frag``)."""
    rows, gpus, values = placements(ctx, pod, feasible)
    return rows, gpus, after(ctx.frag, pod, rows, values)


def fgd_scores(
    ctx: SimContext, rows: np.ndarray, after: np.ndarray, table: FragTable | None = None
) -> np.ndarray:
    """FGD's integer score of each placement; ``after`` under ``table`` (default ``ctx.frag``)."""
    t = table if table is not None else ctx.frag
    delta_gpu = (t.node_frag[rows] - after) / t.model.total / 1000.0
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
