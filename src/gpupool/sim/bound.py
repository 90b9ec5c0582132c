"""A floor under the unallocated GPU: what no packing of the same arrivals can beat (two relaxations).

Role: the FGD headline is the unallocated GPU % when the arrived GPU request equals 100 % of the
cluster's capacity. For one (nodes, pods, seed) this module takes the same arrival order as
`gpupool.sim.engine.run` (same seed, same streams), cuts it where the cumulative GPU request would
pass 100 % of capacity, and bounds the GPU any packing of that set could place, even an offline one
that sees every pod in advance and may reorder them.

The relaxation: pool the cluster into one node with the cluster's total GPU and total CPU, and let
pods be split. Placing GPU then costs only CPU, so the best fractional choice takes the pods with
the least CPU per GPU first (a fractional knapsack with one binding resource besides the GPU itself,
for which greedy is optimal) until the CPU or the GPU runs out. Dropped: per-node and per-card
limits, memory, GPU-model pins, CPU-only pods (placing them never helps the GPU). Every real packing
is feasible for the relaxation, so its value is an upper bound on the placeable GPU and
``unallocated_pct`` is a lower bound (a floor) on the unallocated GPU of ANY policy, online or not.
It is loose where CPU does not bind (it then says only "the arrivals fit"), tight where it does.

The second floor (`gpupool.sim.cardfloor`): the GPU that sharing pods must strand inside their
cards (bin packing bounded by dual feasible functions, node boundaries and CPU dropped). It is the
informative one where CPU does not bind. Both are floors of the same quantity, so the larger is
one too: ``placeable_milli`` is the smaller of the two upper bounds on the placeable GPU.
Exact integer and rational arithmetic; no constants; no time, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from gpupool.sim.cardfloor import pooled_bfd_unallocated_milli, sharing_floor_milli
from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec, PodSpec
from gpupool.sim.workload import arrival_order, sorted_by_name, streams


@dataclass(frozen=True, slots=True)
class BoundResult:
    seed: int
    capacity_milli: int
    arrived_milli: int
    """GPU request of the bounded set (the arrival prefix up to 100 % of capacity)."""
    placeable_milli: int
    """Upper bound on the GPU milli any packing of that set places (rounded down): the smaller of
    the two relaxations' values."""
    cpu_placeable_milli: int = -1
    """The pooled-CPU relaxation's value alone (-1: not computed)."""
    cards_placeable_milli: int = -1
    """The sharing pods' card-packing floor's value alone (-1: not computed)."""
    pooled_bfd_placeable_milli: int = -1
    """Not a bound: what best-fit decreasing places on the pooled cluster, CPU ignored (-1: not
    computed); `gpupool.sim.cardfloor.pooled_bfd_unallocated_milli`."""

    @property
    def unallocated_pct(self) -> float:
        return round(100.0 - 100.0 * self.placeable_milli / self.capacity_milli, 4)


def arrived_prefix(pods_by_name: Sequence[PodSpec], order: np.ndarray, capacity_milli: int) -> list[int]:
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


def placeable_milli(pods: Sequence[PodSpec], *, gpu_milli: int, cpu_milli: int) -> int:
    """The relaxation's optimum: least CPU per GPU first, the last pod split; rounded down."""
    gpu_pods = sorted(
        (p for p in pods if p.total_gpu_milli > 0), key=lambda p: Fraction(p.cpu_milli, p.total_gpu_milli)
    )
    placed = Fraction(0)
    cpu_left = Fraction(cpu_milli)
    for p in gpu_pods:
        room: Fraction = gpu_milli - placed
        if room <= 0:
            break
        want: Fraction = min(Fraction(p.total_gpu_milli), room)
        take = want if not p.cpu_milli else min(want, cpu_left * p.total_gpu_milli / p.cpu_milli)
        placed += take
        cpu_left -= take * p.cpu_milli / p.total_gpu_milli
        if take < want:  # CPU ran out
            break
    return int(placed)


def _split(pods: Sequence[PodSpec]) -> tuple[list[int], int]:
    """(sharing sizes, whole-card milli). A pod asking less than a card on each of several cards
    counts as that many sharing pods (dropping the rule that they sit on different cards only
    loosens the floor)."""
    sharing: list[int] = []
    whole = 0
    for p in pods:
        if p.gpu_milli >= MILLI_PER_GPU:
            whole += p.total_gpu_milli
        elif p.num_gpu:
            sharing.extend([p.gpu_milli] * p.num_gpu)
    return sharing, whole


def offline_bound(nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], *, seed: int) -> BoundResult:
    """The floor for the seed's arrivals up to 100 % of the GPU capacity of ``nodes``."""
    arrivals_rng, _, _ = streams(seed)
    gpu_nodes = [nd for nd in nodes if nd.gpu_count > 0]
    capacity = sum(nd.gpu_count for nd in gpu_nodes) * 1000
    by_name = sorted_by_name(pods)
    order = arrival_order(by_name, capacity_milli=capacity, rng=arrivals_rng)
    chosen = [by_name[i] for i in arrived_prefix(by_name, order, capacity)]
    cpu = placeable_milli(chosen, gpu_milli=capacity, cpu_milli=sum(nd.cpu_milli for nd in gpu_nodes))
    sharing, whole = _split(chosen)
    cards = capacity - math.ceil(sharing_floor_milli(sharing, capacity_milli=capacity, whole_milli=whole))
    return BoundResult(
        seed=seed,
        capacity_milli=capacity,
        arrived_milli=sum(p.total_gpu_milli for p in chosen),
        placeable_milli=min(cpu, cards),
        cpu_placeable_milli=cpu,
        cards_placeable_milli=cards,
        pooled_bfd_placeable_milli=capacity
        - pooled_bfd_unallocated_milli(sharing, capacity_milli=capacity, whole_milli=whole),
    )
