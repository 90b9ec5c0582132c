"""The simulator's policy plug-in point: a policy picks a node and GPUs over vectorised node state.

The engine filters (GPU model allowed, enough GPUs each with enough free share, enough CPU and
memory), hands the policy the feasible node rows (ascending = tie order) and commits the answer
through the core allocator. A policy never mutates the mirror; stateful policies learn about every
commit through `SimPolicy.placed`.

Tie rule for every built-in policy: among equal scores the lowest row wins (``np.argmax`` returns
the first maximum), i.e. the seed's random node order, as the artifact's patched scheduler does.
GPU helpers: `best_fit_gpu` (smallest sufficient free share, lowest index on ties) and
`exclusive_gpus` (lowest-index fully free cards), the artifact's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from gpupool.sim.frag import FragTable
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.trace import MILLI_PER_GPU
from gpupool.sim.workload import TargetWorkload

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000
MAX_SCORE = 100


@dataclass(frozen=True, slots=True)
class PodView:
    index: int
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    spec_key: str

    @property
    def is_sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass
class SimContext:
    mirror: MirrorLedger
    frag: FragTable
    target: TargetWorkload
    """FGD's target workload (the popular shapes covering 95 % of the original pods)."""
    rng: np.random.Generator
    population: TargetWorkload | None = None
    """Every shape of the original pod list with its count (None: use ``target``)."""


Choice = tuple[int, tuple[int, ...]]
"""(node row, GPU indices on that node); no GPUs for a CPU-only pod."""


class SimPolicy(Protocol):
    name: ClassVar[str]

    def choose(self, ctx: SimContext, pod: PodView, feasible: np.ndarray) -> Choice:
        """Pick among ``feasible`` (non-empty, ascending node rows)."""
        ...

    def placed(self, ctx: SimContext, pod: PodView, choice: Choice) -> None:
        """Called after each committed placement (stateful policies update themselves here)."""
        ...


class StatelessPolicy:
    name: ClassVar[str] = ""

    def placed(self, ctx: SimContext, pod: PodView, choice: Choice) -> None:
        return None


def best_fit_gpu(row: np.ndarray, gpu_milli: int) -> int:
    """Index of the GPU with the smallest free share >= ``gpu_milli`` (lowest index on ties)."""
    cand = np.where(row >= gpu_milli, row, MILLI_PER_GPU + 1)
    return int(np.argmin(cand))


def exclusive_gpus(row: np.ndarray, num_gpu: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.flatnonzero(row == MILLI_PER_GPU)[:num_gpu])


def default_gpus(ctx: SimContext, pod: PodView, node: int) -> tuple[int, ...]:
    """Best fit for a sharing pod, lowest-index free cards otherwise, none for a CPU pod."""
    if pod.num_gpu == 0:
        return ()
    row = ctx.mirror.gpu_free[node]
    if pod.is_sharing:
        return (best_fit_gpu(row, pod.gpu_milli),)
    return exclusive_gpus(row, pod.num_gpu)


def pick_max(feasible: np.ndarray, scores: np.ndarray) -> int:
    """The feasible row with the highest score; the first (tie order) on ties."""
    return int(feasible[int(np.argmax(scores))])
