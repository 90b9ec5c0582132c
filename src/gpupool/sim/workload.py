"""The FGD experiment's inputs derived from a trace: target workload, arrival order, node tie order.

Role: everything random about one run comes from here, from one explicit seed, so a run is a pure
function of (nodes, pods, policy, seed).

- `target_workload` builds FGD's "typical pods" once from the ORIGINAL pod list (before shuffling
  and top-up): each pod becomes a shape (cpu milli, per-GPU milli, GPU count, allowed models); shapes
  are sorted by count (descending; ties by the shape itself, descending, as the artifact's reversed
  sort does) and the most frequent ones are kept until they cover at least `POPULARITY` of all pods.
  Weights stay integer counts (the artifact renormalises to probabilities; the factor cancels in
  every comparison and keeps our fragmentation arithmetic exact).
- `arrival_order` sorts pods by name, shuffles them, then appends pods drawn uniformly with
  replacement from the name-sorted list until the next one would push the total GPU request past
  ``tune_ratio`` x capacity (the artifact checks only the sampled pod's per-GPU milli there; we use
  its total, which only differs for the last multi-GPU draw).
- `node_tie_order` is the seed's random permutation of the name-sorted nodes: the artifact prefixes
  node names with it and breaks score ties by the smallest name, i.e. by this order.

Streams: ``SeedSequence(seed).spawn(3)`` gives independent generators for arrivals, node order and
the policy (e.g. ``random``), so a policy's draws never shift the arrival order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec, PodSpec, TraceFormatError

POPULARITY = 0.95
TUNE_RATIO = 1.3
MAX_ARRIVALS = 2_000_000
"""The most pod arrivals one run may need (`require_bounded_arrivals`): about 150 times the
published openb pod lists' (8,500-13,400 arrivals once topped up on their 6,212 GPUs), and
about a quarter of an hour of placements per seed with the default policy on one core."""


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """One task shape of the target workload; ordered like the artifact's PodResource.Less."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    spec_key: str


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    shapes: tuple[Shape, ...]
    counts: tuple[int, ...]
    """Integer weight of each shape (its number of pods in the original list)."""
    min_memory_mib: tuple[int, ...] = ()
    """Per shape, the smallest memory request among its pods (empty: unknown, taken as 0). Memory is
    not part of the shape (the artifact's key); this is what "one pod of the shape fits a node's free
    memory" needs (`gpupool.sim.frag`, ``memory=True``)."""

    @property
    def total(self) -> int:
        return sum(self.counts)

    def probabilities(self) -> tuple[float, ...]:
        t = self.total
        return tuple(c / t for c in self.counts)


def shape_of(p: PodSpec) -> Shape:
    return Shape(cpu_milli=p.cpu_milli, gpu_milli=p.gpu_milli, num_gpu=p.num_gpu, spec_key=p.spec_key)


def target_workload(pods: Sequence[PodSpec], *, popularity: float = POPULARITY) -> TargetWorkload:
    counts: Counter[Shape] = Counter()
    least_mib: dict[Shape, int] = {}
    for p in pods:
        key = shape_of(p)
        counts[key] += 1
        least_mib[key] = min(least_mib.get(key, p.memory_mib), p.memory_mib)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    need = popularity * len(pods)
    kept: list[tuple[Shape, int]] = []
    cum = 0
    for shape, n in ranked:
        if cum >= need:
            break
        kept.append((shape, n))
        cum += n
    return TargetWorkload(
        shapes=tuple(s for s, _ in kept),
        counts=tuple(n for _, n in kept),
        min_memory_mib=tuple(least_mib[s] for s, _ in kept),
    )


def streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    arrivals, nodes, policy = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    return arrivals, nodes, policy


def sorted_by_name(pods: Sequence[PodSpec]) -> tuple[PodSpec, ...]:
    return tuple(sorted(pods, key=lambda p: p.name))


def arrival_order(
    pods_by_name: Sequence[PodSpec],
    *,
    capacity_milli: int,
    rng: np.random.Generator,
    tune_ratio: float = TUNE_RATIO,
) -> np.ndarray:
    """Indices into ``pods_by_name``: a shuffle of all of them, then resampled top-up pods."""
    n = len(pods_by_name)
    order = rng.permutation(n)
    total = sum(p.total_gpu_milli for p in pods_by_name)
    target = tune_ratio * capacity_milli
    extra: list[int] = []
    if total < target and any(p.total_gpu_milli for p in pods_by_name):
        while True:
            idx = int(rng.integers(n))
            add = pods_by_name[idx].total_gpu_milli
            if total + add > target:
                break
            total += add
            extra.append(idx)
    return np.concatenate([order, np.asarray(extra, dtype=np.int64)]).astype(np.int64)


def expected_arrivals(pods: Sequence[PodSpec], *, capacity_milli: int, tune_ratio: float = TUNE_RATIO) -> int:
    """About how many arrivals `arrival_order` makes: every pod once, then uniform draws (CPU-only
    pods included) until ``tune_ratio`` x capacity: the shortfall over the mean GPU request."""
    total = sum(p.total_gpu_milli for p in pods)
    short = tune_ratio * capacity_milli - total
    if short <= 0 or total <= 0:
        return len(pods)
    return len(pods) + int(short * len(pods) / total)


def require_bounded_arrivals(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], *, pods_path: object, limit: int = MAX_ARRIVALS
) -> None:
    """Refuse (`TraceFormatError`, naming the file) a pod list whose pods ask for so little GPU
    against the cluster that topping it up would take more than ``limit`` arrivals (a run of hours
    that looks hung)."""
    capacity = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    n = expected_arrivals(pods, capacity_milli=capacity)
    if n > limit:
        mean = sum(p.total_gpu_milli for p in pods) / max(1, len(pods))
        raise TraceFormatError(
            f"{pods_path}: filling {TUNE_RATIO:.0%} of the {capacity // MILLI_PER_GPU} GPUs' capacity with "
            f"these pods takes about {n:,} arrivals (mean {mean:.3g} milli-GPU per pod, CPU-only pods "
            f"included), more than the simulator's limit of {limit:,}: use pods that ask for more GPU, "
            "or fewer nodes"
        )


def node_tie_order(nodes: Sequence[NodeSpec], *, rng: np.random.Generator) -> tuple[NodeSpec, ...]:
    """Nodes in tie-break order: name-sorted node i gets prefix perm[i]; smallest prefix wins ties."""
    by_name = sorted(nodes, key=lambda nd: nd.name)
    perm = rng.permutation(len(by_name))
    ranked = sorted(range(len(by_name)), key=lambda i: int(perm[i]))
    return tuple(by_name[i] for i in ranked)
