"""An offline packing estimate: how much of the arrived GPU request a packer that sees it all could place.

Role: the FGD headline is the unallocated GPU % when the arrived GPU request equals 100 % of the
cluster's capacity. An online policy places pods in arrival order and never moves one; an offline
packer knows the whole arrived set up front. For one (nodes, pods, seed) this module takes the same
arrival order as `gpupool.sim.engine.run` (same seed, same streams), cuts it where the cumulative GPU
request would pass 100 % of capacity, and packs that set `PACKINGS` times with randomised
best-fit-decreasing heuristics; the best packing found is the estimate.

A packing: pods sorted by decreasing size (GPU count, then per-GPU share, then CPU), ties in a random
order; each pod goes to a feasible node (same filters as the engine: model allowed, enough GPUs each
with enough free share, CPU, memory) chosen by one of two rules, alternating between packings:
- ``gpu``: least free GPU left on the node, then least CPU left;
- ``cpu``: least CPU left per free GPU card left (keeps CPU next to the cards that need it), then
  least GPU left;
remaining ties by a random node order. Sharing pods take the fitting card with the least free share;
whole-card pods the lowest-index fully free cards. A pod that fits nowhere is skipped.

What it is and is not: a best KNOWN packing, i.e. an achievable allocation (an upper bound on the
unallocated GPU of the best packing is this value; the true optimum can only be lower). It is not a
proof of optimality. Reported as unallocated GPU % = 100 - placed / capacity x 100. No constants
besides the number of packings; no time, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec, PodSpec
from gpupool.sim.workload import arrival_order, node_tie_order, sorted_by_name, streams

PACKINGS = 8
RULES = ("gpu", "cpu")


@dataclass(frozen=True, slots=True)
class BoundResult:
    seed: int
    capacity_milli: int
    arrived_milli: int
    """GPU request of the packed set (the arrival prefix up to 100 % of capacity)."""
    best_placed_milli: int
    placed_milli: tuple[int, ...]
    """GPU milli placed by each packing, in packing order."""

    @property
    def unallocated_pct(self) -> float:
        return round(100.0 - 100.0 * self.best_placed_milli / self.capacity_milli, 4)


def arrived_prefix(
    pods_by_name: Sequence[PodSpec], order: np.ndarray, capacity_milli: int
) -> list[int]:
    """The leading indices of ``order`` whose cumulative GPU request stays within capacity."""
    out: list[int] = []
    total = 0
    for idx in order.tolist():
        add = pods_by_name[idx].total_gpu_milli
        if total + add > capacity_milli:
            break
        total += add
        out.append(idx)
    return out


def pack_once(
    mirror: MirrorLedger, pods: Sequence[PodSpec], *, rule: str, rng: np.random.Generator
) -> int:
    """Place ``pods`` (in the given order) on a fresh copy of ``mirror``'s books; GPU milli placed."""
    gpu_free = mirror.gpu_free.copy()
    cpu_free = mirror.cpu_free.copy()
    mem_free = mirror.mem_free.copy()
    node_rank = rng.permutation(len(mirror))
    models = mirror.models
    masks: dict[str, np.ndarray] = {}
    placed = 0
    for p in pods:
        ok = (cpu_free >= p.cpu_milli) & (mem_free >= p.memory_mib)
        if p.num_gpu:
            mask = masks.get(p.spec_key)
            if mask is None:
                mask = np.array([bool(m) and (not p.gpu_spec or m in p.gpu_spec) for m in models])
                masks[p.spec_key] = mask
            ok &= mask[mirror.model]
            ok &= (gpu_free >= p.gpu_milli).sum(axis=1) >= p.num_gpu
        rows = np.flatnonzero(ok)
        if len(rows) == 0:
            continue
        gpu_left = gpu_free[rows].sum(axis=1) - p.total_gpu_milli
        cpu_left = cpu_free[rows] - p.cpu_milli
        if rule == "gpu":
            keys = (node_rank[rows], cpu_left, gpu_left)
        else:
            cards_left = np.maximum(gpu_left, 0) // MILLI_PER_GPU + 1
            keys = (node_rank[rows], gpu_left, cpu_left // cards_left)
        node = int(rows[int(np.lexsort(keys)[0])])
        if p.num_gpu == 1 and p.gpu_milli < MILLI_PER_GPU:
            free = gpu_free[node]
            left = np.where(free >= p.gpu_milli, free, MILLI_PER_GPU + 1)
            gpus = [int(np.argmin(left))]
        elif p.num_gpu:
            gpus = np.flatnonzero(gpu_free[node] == MILLI_PER_GPU)[: p.num_gpu].tolist()
            if len(gpus) < p.num_gpu:  # whole-card pods need fully free cards
                continue
        else:
            gpus = []
        for g in gpus:
            gpu_free[node, g] -= p.gpu_milli
        cpu_free[node] -= p.cpu_milli
        mem_free[node] -= p.memory_mib
        placed += p.total_gpu_milli
    return placed


def offline_bound(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], *, seed: int, packings: int = PACKINGS
) -> BoundResult:
    """Best of ``packings`` randomised packings of the seed's arrivals up to 100 % of capacity."""
    arrivals_rng, nodes_rng, _ = streams(seed)
    mirror = MirrorLedger(node_tie_order([nd for nd in nodes if nd.gpu_count > 0], rng=nodes_rng))
    by_name = sorted_by_name(pods)
    order = arrival_order(by_name, capacity_milli=mirror.capacity_milli, rng=arrivals_rng)
    chosen = [by_name[i] for i in arrived_prefix(by_name, order, mirror.capacity_milli)]
    arrived = sum(p.total_gpu_milli for p in chosen)
    rng = np.random.default_rng([seed, 1_000_003])
    results = []
    for k in range(packings):
        noise = rng.permutation(len(chosen))
        ranked = sorted(
            range(len(chosen)),
            key=lambda i: (-chosen[i].num_gpu, -chosen[i].gpu_milli, -chosen[i].cpu_milli, int(noise[i])),
        )
        results.append(pack_once(mirror, [chosen[i] for i in ranked], rule=RULES[k % len(RULES)], rng=rng))
    return BoundResult(
        seed=seed,
        capacity_milli=mirror.capacity_milli,
        arrived_milli=arrived,
        best_placed_milli=max(results),
        placed_milli=tuple(results),
    )
