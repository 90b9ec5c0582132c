"""Baseline policies as the FGD artifact implements them, plus the seed's VRAM-only best fit.

All scores are the artifact's integers (0..100, truncated), so ties (broken by node order) happen
exactly where they happen there. ``T`` = a node's total free GPU milli, ``cpu`` = its free CPU milli.

- ``random``: a uniformly random feasible node; a sharing pod gets a uniformly random fitting GPU.
- ``dotprod`` (Tetris): ``int(100 x (1 - (cpu/128k x c/128k + T/8k x g/8k) / 2))``; GPU best fit.
- ``clustering``: bands by the pod types a node hosts (only this type 75 + x > several incl. it
  50 + x > none 25 + x > only others x, with ``x = 25 x (8000 - T) // 8000``); CPU pods score 0.
- ``packing``: shared GPUs first (``max(100 - sum(free x 100 // 1000) // 10, 50)``), then free cards
  on a used node (``max(50 - cards, 33)``), then an idle node (``max(33 - cards, cards)``); CPU 0.
- ``bestfit``: ``int(100 x (1 - ((cpu - c)/128k x 0.5 + (T - g)/8k x 0.5)))`` (min-max
  normalisation across nodes keeps the order, so it is left out); GPU best fit.
- ``seed-bestfit``: the seed's rule adapted to the trace (VRAM there, GPU share here): the
  (node, GPU) leaving the least free share on the chosen GPU; multi-GPU pods go to the node with the
  fewest free whole cards (as the core's card allocator does); CPU pods take the first feasible node.
  It ignores CPU and the other GPUs of the node, as the seed did.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.sim.policies.base import (
    MAX_SCORE,
    MAX_SPEC_CPU_MILLI,
    MAX_SPEC_GPU_MILLI,
    Choice,
    PodView,
    SimContext,
    StatelessPolicy,
    default_gpus,
    exclusive_gpus,
    pick_max,
)
from gpupool.sim.trace import MILLI_PER_GPU


class RandomPolicy(StatelessPolicy):
    name: ClassVar[str] = "random"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        node = int(feasible[int(ctx.rng.integers(len(feasible)))])
        if pod.is_sharing:
            fitting = np.flatnonzero(ctx.mirror.gpu_free[node] >= pod.gpu_milli)
            return node, (int(fitting[int(ctx.rng.integers(len(fitting)))]),)
        return node, default_gpus(ctx, pod, node)


class DotProdPolicy(StatelessPolicy):
    name: ClassVar[str] = "dotprod"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        m = ctx.mirror
        a = m.cpu_free[feasible] / MAX_SPEC_CPU_MILLI
        b = pod.cpu_milli / MAX_SPEC_CPU_MILLI
        x = ctx.frag.free_total[feasible] / MAX_SPEC_GPU_MILLI
        y = pod.total_gpu_milli / MAX_SPEC_GPU_MILLI
        s = 1.0 - (a * b + x * y) / 2
        scores = np.trunc(float(MAX_SCORE) * s)
        node = pick_max(feasible, scores)
        return node, default_gpus(ctx, pod, node)


def bestfit_scores(ctx: SimContext, pod: PodView, feasible: np.ndarray) -> np.ndarray:
    m = ctx.mirror
    s = (m.cpu_free[feasible] - pod.cpu_milli) / MAX_SPEC_CPU_MILLI * 0.5
    s = s + (ctx.frag.free_total[feasible] - pod.total_gpu_milli) / MAX_SPEC_GPU_MILLI * 0.5
    out: np.ndarray = np.trunc((1.0 - s) * MAX_SCORE)
    return out


class BestFitPolicy(StatelessPolicy):
    name: ClassVar[str] = "bestfit"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        node = pick_max(feasible, bestfit_scores(ctx, pod, feasible))
        return node, default_gpus(ctx, pod, node)


class PackingPolicy(StatelessPolicy):
    name: ClassVar[str] = "packing"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        if pod.num_gpu == 0:
            return int(feasible[0]), ()
        m = ctx.mirror
        free = m.gpu_free[feasible]
        n_gpu = m.gpu_count[feasible]
        full = (free == MILLI_PER_GPU).sum(axis=1)
        idle_node = full == n_gpu
        if pod.is_sharing:
            best = np.where(free >= pod.gpu_milli, free, MILLI_PER_GPU + 1).min(axis=1)
            used_cards = (best == MILLI_PER_GPU).astype(np.int64)
            share = np.maximum(MAX_SCORE - (best * 100 // MILLI_PER_GPU) // 10, MAX_SCORE // 2)
        else:
            used_cards = np.full(len(feasible), pod.num_gpu, dtype=np.int64)
            share = np.zeros(len(feasible), dtype=np.int64)
        on_used = np.maximum(MAX_SCORE // 2 - used_cards, MAX_SCORE // 3)
        on_idle = np.maximum(MAX_SCORE // 3 - full, full)
        scores = np.where(idle_node, on_idle, np.where(used_cards > 0, on_used, share))
        node = pick_max(feasible, scores)
        return node, default_gpus(ctx, pod, node)


class ClusteringPolicy:
    """Needs to know which pod types each node hosts, so it keeps a count per (node, type)."""

    name: ClassVar[str] = "clustering"

    def __init__(self) -> None:
        self._types: dict[int, int] = {}  # 0 = sharing; k = k whole GPUs
        self._counts: np.ndarray | None = None

    def _type(self, pod: PodView) -> int:
        return 0 if pod.is_sharing else pod.num_gpu

    def _ensure(self, ctx: SimContext, t: int) -> tuple[np.ndarray, int]:
        if self._counts is None:
            self._counts = np.zeros((len(ctx.mirror), 0), dtype=np.int64)
        if t not in self._types:
            self._types[t] = self._counts.shape[1]
            self._counts = np.concatenate([self._counts, np.zeros((len(ctx.mirror), 1), np.int64)], axis=1)
        return self._counts, self._types[t]

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        if pod.num_gpu == 0:
            return int(feasible[0]), ()
        counts, col = self._ensure(ctx, self._type(pod))
        hosted = counts[feasible] > 0
        n_types = hosted.sum(axis=1)
        same = hosted[:, col]
        x = (MAX_SCORE // 4) * (MAX_SPEC_GPU_MILLI - ctx.frag.free_total[feasible]) // MAX_SPEC_GPU_MILLI
        band = np.where(same, np.where(n_types == 1, 75, 50), np.where(n_types == 0, 25, 0))
        node = pick_max(feasible, band + x)
        return node, default_gpus(ctx, pod, node)

    def placed(self, ctx: SimContext, pod: PodView, choice: Choice) -> None:
        if pod.num_gpu == 0:
            return
        counts, col = self._ensure(ctx, self._type(pod))
        counts[choice[0], col] += 1


class SeedBestFitPolicy(StatelessPolicy):
    name: ClassVar[str] = "seed-bestfit"

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        m = ctx.mirror
        if pod.num_gpu == 0:
            return int(feasible[0]), ()
        free = m.gpu_free[feasible]
        if pod.num_gpu == 1:
            left = np.where(free >= pod.gpu_milli, free - pod.gpu_milli, MILLI_PER_GPU + 1)
            flat = int(np.argmin(left))  # row-major: tie order first, then GPU index
            row, gpu = divmod(flat, free.shape[1])
            return int(feasible[row]), (gpu,)
        full = (free == MILLI_PER_GPU).sum(axis=1)
        node = int(feasible[int(np.argmin(full))])
        return node, exclusive_gpus(m.gpu_free[node], pod.num_gpu)
